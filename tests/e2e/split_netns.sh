#!/usr/bin/env bash
# The split roles across two network namespaces joined by a veth pair — two hosts on one
# machine: namespace A (10.232.0.1) and namespace B (10.232.0.2), where the test itself runs.
# split_e2e.mjs puts prefill 1 and decode 1 in A, the router, prefill 2 and decode 2 in B;
# fabric_e2e.mjs puts the prefill and the decode in A and attacks them from B.
# usage: split_netns.sh NODE SCRIPT_MJS KVFENCE NODE_MODULES WORK
# Fails, saying why, when namespaces cannot be created here (the test needs root and iproute2).
set -uo pipefail
node=$1 script=$2 kvfence=$3 modules=$4 work=$5
a=kvsA$$ b=kvsB$$
if ! ip netns add "$a" 2>/tmp/kvf_netns_err.$$; then
  echo "FAIL: cannot create network namespaces here: $(cat /tmp/kvf_netns_err.$$)"
  rm -f /tmp/kvf_netns_err.$$
  exit 1
fi
rm -f /tmp/kvf_netns_err.$$
cleanup() { ip netns pids "$a" 2>/dev/null | xargs -r kill -9; ip netns pids "$b" 2>/dev/null | xargs -r kill -9;
            ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null; }
trap cleanup EXIT
ip netns add "$b" || exit 1
ip link add "v$a" type veth peer name "v$b" || exit 1
ip link set "v$a" netns "$a" && ip link set "v$b" netns "$b" || exit 1
ip -n "$a" addr add 10.232.0.1/24 dev "v$a" && ip -n "$b" addr add 10.232.0.2/24 dev "v$b" || exit 1
ip -n "$a" link set "v$a" up && ip -n "$b" link set "v$b" up || exit 1
ip -n "$a" link set lo up && ip -n "$b" link set lo up || exit 1
echo "# across namespaces: $a (10.232.0.1) and $b (10.232.0.2), where $(basename "$script") runs"
ip netns exec "$b" "$node" "$script" --kvfence "$kvfence" --node-modules "$modules" --work "$work" \
  --ns-a "$a" --host-a 10.232.0.1 --host-b 10.232.0.2
