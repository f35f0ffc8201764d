#!/usr/bin/env bash
# The transport across two network namespaces joined by a veth pair — two hosts on one machine:
# the fence test (target in one namespace, writer in the other) and the two-process handoff
# tests (decode in one, the `kvfence prefill` process in the other).
# usage: netns.sh TEST_FENCE TEST_PROCS KVFENCE
# Fails, saying why, when namespaces cannot be created here (the test needs root and iproute2).
set -uo pipefail
fence=$1 procs=$2 kvfence=$3
a=kvfA$$ b=kvfB$$
if ! ip netns add "$a" 2>/tmp/kvf_netns_err.$$; then
  echo "FAIL: cannot create network namespaces here: $(cat /tmp/kvf_netns_err.$$)"
  rm -f /tmp/kvf_netns_err.$$
  exit 1
fi
rm -f /tmp/kvf_netns_err.$$
cleanup() { ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null; }
trap cleanup EXIT
ip netns add "$b" || exit 1
ip link add "v$a" type veth peer name "v$b" || exit 1
ip link set "v$a" netns "$a" && ip link set "v$b" netns "$b" || exit 1
ip -n "$a" addr add 10.231.0.1/24 dev "v$a" && ip -n "$b" addr add 10.231.0.2/24 dev "v$b" || exit 1
ip -n "$a" link set "v$a" up && ip -n "$b" link set "v$b" up || exit 1
ip -n "$a" link set lo up && ip -n "$b" link set lo up || exit 1
status=0
echo "# fence across namespaces: target $a (10.231.0.1), writer $b"
ip netns exec "$a" env KVF_TEST_TARGET_HOST=10.231.0.1 KVF_TEST_WRITER_NETNS="$b" \
  "$fence" test_stopped test_killed || status=1
echo "# handoffs across namespaces: prefill $a (10.231.0.1), decode $b"
ip netns exec "$b" env KVF_TEST_PREFILL_HOST=10.231.0.1 KVF_TEST_PREFILL_NETNS="$a" \
  "$procs" "$kvfence" test_soak test_kill || status=1
exit $status
