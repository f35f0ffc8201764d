/*
 * spin/handoff.pml — the prefill→decode handoff protocol of kvfence, for spin.
 *
 * Three processes: Decode (the decode worker: its page pool and its request state machine),
 * Prefill (the prefill worker: its request state machine and its source buffer) and Wire (the
 * remote side of one-sided puts: a posted write lands in a decode page at any later time, unless
 * the writer's connection epoch was fenced first). Control messages travel through a network that
 * loses, duplicates and reorders without limit (see "The network" below).
 *
 * State and message names are the C enum names of include/kvfence/pool.h and
 * include/kvfence/proto.h, so a trail reads in the same words as a trace of the C code.
 * docs/SPIN.md says what is modelled, what is abstracted and why that is sound.
 *
 * Safety properties, each an assert below:
 *   P1  no page is reassigned while a write that can still land targets it (a write can land
 *       while its grant is unfenced): checked when a page is allocated and when a write lands;
 *   P2  decode never reads a page that was not written for its request: when a committed request
 *       reads its pages, each page still carries its tag and holds the bytes of that request
 *       under that request's tag;
 *   P3  a request whose grant belongs to a fenced epoch never commits (a fence voids every grant
 *       of the epoch, and a completion from a fenced epoch proves nothing);
 *   P4  a put carries only the data of the request it was posted for (the source is kept until
 *       the put completed): checked when a write lands.
 *
 * CONTENT_ONLY (spin -DCONTENT_ONLY, spin/check.sh --content) keeps P2's check of the bytes
 * alone: P1, P3, P4 and the tag check of a read page are not asserted, so a trail then shows a
 * committed request reading bytes that were not written for it (the model's content check, as
 * the simulator's L1 alone). UNVERIFIED (--unverified)
 * has decode commit without reading the pages or the count (no count, trailer or checksum
 * check), no prefill hand off short and no transport lose a put it reported complete (only those
 * checks would see them): what reaches a read is then what the page lifetime rules alone let
 * through.
 * FORGE_FENCED (--forge-fenced) lets a DONE of the fenced epoch arrive at any time after the
 * fence, counting the request's own tokens (H18: a writer replaying its fenced epoch's answers,
 * as the isolation suite's KVF_TEST_FORGE fenced=1): decode must never act on it.
 *
 * Mutants (the known bugs put back), selected with spin -DMUTANT_<NAME>; each must yield a trail:
 *   MUTANT_PLACEHOLDER_AFTER_REJECT  MUTANT_FREE_AT_CANCEL  MUTANT_FREE_AT_HOLD_TIMEOUT
 *   MUTANT_ACK_BEFORE_DRAIN  MUTANT_ACK_LOST_WHEN_CLEARED  MUTANT_NO_COUNT_CHECK
 *   MUTANT_NO_CHECKSUM_CHECK  MUTANT_STALE_EPOCH_ACCEPTED  MUTANT_SRC_FREED_AT_POST
 *   MUTANT_FENCE_KEEPS_OTHER_GRANTS
 *
 * Configuration: NR = 2 requests (request 0 reserves 2 pages, request 1 reserves 1), NP = 3
 * decode pages, one prefill, one decode, NFENCE fences (connection epochs 0 .. NFENCE).
 */

#define NFENCE 1                  /* fences (epochs 0 .. NFENCE); the option lists assume 1 */
#define NR 2                      /* requests */
#define NP 3                      /* decode pages */
#define NE (NFENCE + 1)           /* connection epochs 0 .. NFENCE */
#define NONE_R 2                  /* "no request": owner of a free page, stamp of old data */
#define NEED(r) ((r) == 0 -> 2 : 1) /* pages (= tokens, one token per page) reserved by r */

/* Page states: enum kvf_page_state (include/kvfence/pool.h). */
mtype:page = { KVF_PAGE_FREE, KVF_PAGE_OWNED, KVF_PAGE_GRANTED, KVF_PAGE_HELD,
               KVF_PAGE_QUARANTINED };
/* Decode-side request states: enum kvf_dreq_state (include/kvfence/proto.h). */
mtype:dreq = { KVF_DREQ_NONE, KVF_DREQ_GRANTED, KVF_DREQ_RUNNING, KVF_DREQ_DRAINING,
               KVF_DREQ_DONE, KVF_DREQ_FAILED };
/* Prefill-side request states: enum kvf_preq_state. */
mtype:preq = { KVF_PREQ_NONE, KVF_PREQ_COMPUTING, KVF_PREQ_WRITING, KVF_PREQ_FLUSHING,
               KVF_PREQ_DRAINING, KVF_PREQ_DONE, KVF_PREQ_CLEARED };
/* Message types: enum kvf_msg_type. KVF_MSG_NEW (router → decode) is the admission step of
 * Decode; KVF_MSG_HELLO (the prefill's new handshake) is part of the fence step. The network
 * below keeps one bit per message rather than these values. */
mtype:msg = { KVF_MSG_HELLO, KVF_MSG_NEW, KVF_MSG_GRANT, KVF_MSG_DONE, KVF_MSG_CANCEL,
              KVF_MSG_CANCEL_ACK, KVF_MSG_REJECT, KVF_MSG_FAIL };

/* ---- decode pool: page metadata (kept apart from page data, as in the C pool) ---- */
mtype:page pgst[NP];              /* page state */
byte pgown[NP];                   /* owner request, NONE_R when free */
byte pgep[NP];                    /* epoch of the grant; (owner, epoch) is the page's tag */

/* ---- decode pool: page data, as the stamp its last writer left (trailer and bytes) ---- */
byte cq[NP];                      /* whose KV the bytes are, named by the trailer's request id;
                                     NONE_R = an earlier customer's data */
byte ce[NP];                      /* trailer: epoch part of the tag */

/* ---- decode requests ---- */
mtype:dreq dst[NR];               /* decode request state */
byte dep[NR];                     /* epoch of the request's current attempt = its nonce */
byte tbl[NR * 2];                 /* page table: tbl[r*2 + k] = page holding r's token k */
byte depoch;                      /* decode's connection epoch with the prefill peer */
byte nfences;                     /* fences so far (bounded by NFENCE) */

/* ---- prefill requests ---- */
mtype:preq pst[NR];               /* prefill request state */
byte pep[NR];                     /* epoch of the attempt prefill works on (its nonce) */
byte pn[NR];                      /* puts posted for the attempt */
bit pph[NR];                      /* mutant placeholder: hand off one token only */
byte powe[NR];                    /* what DRAINING owes once drained: OWE_NONE, OWE_ACK, OWE_FAIL */
#define OWE_NONE 0
#define OWE_ACK 1
#define OWE_FAIL 2
byte sown = NONE_R;               /* prefill source buffer: request holding it */
byte sdata = NONE_R;              /* prefill source buffer: whose KV it holds */

/* ---- writes posted and not yet landed: wr[WI(page, request, epoch)] ---- */
bit wr[NP * NR * NE];
#define WI(p, r, e) (((p) * NR + (r)) * NE + (e))
#define NOWR(r, e) (!wr[WI(0, r, e)] && !wr[WI(1, r, e)] && !wr[WI(2, r, e)])
#define LANDABLE(p) (wr[WI(p, 0, depoch)] || wr[WI(p, 1, depoch)])

/*
 * The network. Each control message is a (type, request, epoch[, count]) triple, and the network
 * is the set of triples sent: a receiver may take any member at any time, in any order, or never
 * (loss: for safety a message never delivered is a message lost). A message stays in the set,
 * and may be delivered again (duplication), as long as a delivery can still change anything; a
 * delivery that could only repeat a step that changes nothing is dropped from the set, which
 * keeps the search small and removes no behaviour. No buffer bounds any of this.
 */
bit m_grant[NR * NE];
bit m_cancel[NR * NE];
bit m_ack[NR * NE];
bit m_reject[NR * NE];
bit m_fail[NR * NE];
bit m_done[NR * NE * 2];          /* DONE carries tokens_written n = 1 or 2 */
#define MI(r, e) ((r) * NE + (e))
#define DI(r, e, n) (MI(r, e) * 2 + (n) - 1)

/*
 * Messages to decode of an attempt that has ended (RUNNING, FAILED) can never enable a step
 * again, since decode matches messages to the current attempt only; forgetting them keeps the
 * state space small and changes no behaviour. With the stale-epoch mutant they stay, since they
 * can then match a later attempt.
 */
#ifdef MUTANT_STALE_EPOCH_ACCEPTED
#define GC_D(r, e) skip
#else
#define GC_D(r, e) m_ack[MI(r, e)] = 0; m_reject[MI(r, e)] = 0; m_fail[MI(r, e)] = 0; \
                   m_done[DI(r, e, 1)] = 0; m_done[DI(r, e, 2)] = 0
#endif

/* Decode's match of a message to the request's current attempt: (request, nonce, epoch). */
#ifdef MUTANT_STALE_EPOCH_ACCEPTED
#define EPOK(r, e) true           /* bug: a message of any epoch matches the request */
#else
#define EPOK(r, e) (dep[r] == (e))
#endif

#if defined(MUTANT_NO_COUNT_CHECK)
#define COUNT_OK(r, n) true       /* bug: tokens_written is not compared with the reservation */
#elif defined(UNVERIFIED)
#define COUNT_OK(r, n) true       /* committed unread, the count included (see UNVERIFIED above) */
#else
#define COUNT_OK(r, n) ((n) == NEED(r))
#endif

#if defined(MUTANT_NO_CHECKSUM_CHECK)
#define PAGE_OK(p, r) true        /* bug: trailer and checksum of the page not verified */
#elif defined(UNVERIFIED)
#define PAGE_OK(p, r) true        /* the pages are committed unread (see UNVERIFIED above) */
#else
#define PAGE_OK(p, r) (cq[p] == (r) && ce[p] == dep[r])
#endif

/* The properties other than P2, off under CONTENT_ONLY. */
#ifdef CONTENT_ONLY
#define ASSERT_P1(c) skip
#define ASSERT_P3(c) skip
#define ASSERT_P4(c) skip
#else
#define ASSERT_P1(c) assert(c)
#define ASSERT_P3(c) assert(c)
#define ASSERT_P4(c) assert(c)
#endif

/* Pages of request r in state s: r's page table has NEED(r) entries. */
#define PG(r, k) tbl[(r) * 2 + (k)]
#define ALLPG(r, s) (pgst[PG(r, 0)] == s && (NEED(r) == 1 || pgst[PG(r, 1)] == s))
#define NFREE ((pgst[0] == KVF_PAGE_FREE) + (pgst[1] == KVF_PAGE_FREE) + (pgst[2] == KVF_PAGE_FREE))

/* Set every page of request r to state s; FREE also drops the owner (kvf_pool release). */
inline set_pages(r, s) {
    pgst[PG(r, 0)] = s;
    if
    :: NEED(r) == 2 -> pgst[PG(r, 1)] = s
    :: else -> skip
    fi;
    if
    :: s == KVF_PAGE_FREE ->
        pgown[PG(r, 0)] = NONE_R; pgep[PG(r, 0)] = 0;
        if
        :: NEED(r) == 2 -> pgown[PG(r, 1)] = NONE_R; pgep[PG(r, 1)] = 0
        :: else -> skip
        fi
    :: else -> skip
    fi
}

/*
 * Allocate one free page for token k of request r and grant it to the prefill peer at the current
 * epoch (kvf_pool alloc: FREE → OWNED, then grant: OWNED → GRANTED). Any free page may be
 * chosen, which covers the C pool's FIFO order. P1: no write that can still land targets it.
 */
inline take_page(r, k) {
    if
    :: pgst[0] == KVF_PAGE_FREE -> PG(r, k) = 0
    :: pgst[1] == KVF_PAGE_FREE -> PG(r, k) = 1
    :: pgst[2] == KVF_PAGE_FREE -> PG(r, k) = 2
    fi;
    ASSERT_P1(!LANDABLE(PG(r, k)));               /* P1 */
    pgst[PG(r, k)] = KVF_PAGE_GRANTED;
    pgown[PG(r, k)] = r;
    pgep[PG(r, k)] = depoch
}

/* P2: a committed request reads token k's page: tag still its own, bytes written for it. */
inline read_page(r, k) {
    ASSERT_P1(pgst[PG(r, k)] == KVF_PAGE_OWNED && pgown[PG(r, k)] == r && pgep[PG(r, k)] == dep[r]);
    assert(cq[PG(r, k)] == r && ce[PG(r, k)] == dep[r])  /* P2: the bytes themselves */
}

/* ======================================================================================= */
/* Decode: the decode worker's side of the handoff (src/proto decode machine + src/pool).  */
/* ======================================================================================= */

/*
 * NEW(r) accepted (or re-admitted after a failure, in a later epoch, so that the epoch names
 * the attempt): KVF_DREQ_NONE/FAILED → KVF_DREQ_GRANTED. Reserve all pages or none, record the
 * tags, send GRANT(r, nonce, epoch, pages, expected tokens).
 */
#define D_ADMIT(r) \
    :: atomic { (dst[r] == KVF_DREQ_NONE || \
                 (dst[r] == KVF_DREQ_FAILED && dep[r] < depoch)) && \
                NFREE >= NEED(r) -> \
        take_page(r, 0); \
        if \
        :: NEED(r) == 2 -> take_page(r, 1) \
        :: else -> skip \
        fi; \
        dep[r] = depoch; dst[r] = KVF_DREQ_GRANTED; m_grant[MI(r, depoch)] = 1 }

/*
 * DONE(r, e, n) on a GRANTED request of the same attempt: verify tokens_written == reserved and,
 * for each page the completion covers, its trailer tag and request id and the checksum of its
 * bytes. Pass: the grants end (GRANTED → OWNED), KVF_DREQ_RUNNING. Fail: the request fails with
 * its grants still outstanding — pages HELD, CANCEL sent, KVF_DREQ_DRAINING (proof or fence ends
 * them). P3: the attempt's epoch was not fenced.
 */
#define D_DONE(r, e, n) \
    :: d_step { m_done[DI(r, e, n)] && dst[r] == KVF_DREQ_GRANTED && EPOK(r, e) -> \
        if \
        :: COUNT_OK(r, n) && PAGE_OK(PG(r, 0), r) && ((n) == 1 || PAGE_OK(PG(r, 1), r)) -> \
            m_done[DI(r, e, n)] = 0; \
            ASSERT_P3(dep[r] == depoch);                                /* P3 */ \
            set_pages(r, KVF_PAGE_OWNED); dst[r] = KVF_DREQ_RUNNING; GC_D(r, e) \
        :: else -> \
            set_pages(r, KVF_PAGE_HELD); dst[r] = KVF_DREQ_DRAINING; \
            m_cancel[MI(r, dep[r])] = 1 \
        fi }

/*
 * Proof that no write of the attempt can still land: REJECT (prefill posted none) and FAIL
 * (prefill failed after posting and drained its writes) on GRANTED or DRAINING; CANCEL_ACK
 * (prefill drained its writes) and a late DONE (sent only after the flush; D_LATE_DONE) on
 * DRAINING. Grants end, pages return to FREE, KVF_DREQ_FAILED. QUARANTINED pages wait for the
 * fence, whatever proof comes later.
 */
#define D_PROOF(r, e, bag, okstate) \
    :: d_step { bag[MI(r, e)] && EPOK(r, e) && okstate && \
                (dst[r] == KVF_DREQ_GRANTED || \
                 (dst[r] == KVF_DREQ_DRAINING && ALLPG(r, KVF_PAGE_HELD))) -> \
        set_pages(r, KVF_PAGE_FREE); dst[r] = KVF_DREQ_FAILED; GC_D(r, e) }

#define D_LATE_DONE(r, e, n) \
    :: d_step { m_done[DI(r, e, n)] && EPOK(r, e) && dst[r] == KVF_DREQ_DRAINING && \
                ALLPG(r, KVF_PAGE_HELD) -> \
        set_pages(r, KVF_PAGE_FREE); dst[r] = KVF_DREQ_FAILED; GC_D(r, e) }

/*
 * Client disconnect or decode-side timeout on a GRANTED request: release while granted. Pages go
 * HELD, CANCEL(r, nonce) sent, KVF_DREQ_DRAINING.
 */
#ifdef MUTANT_FREE_AT_CANCEL
#define D_CANCEL(r) \
    :: d_step { dst[r] == KVF_DREQ_GRANTED -> /* bug: freed with grants outstanding */ \
        set_pages(r, KVF_PAGE_FREE); dst[r] = KVF_DREQ_FAILED; m_cancel[MI(r, dep[r])] = 1 }
#else
#define D_CANCEL(r) \
    :: d_step { dst[r] == KVF_DREQ_GRANTED -> \
        set_pages(r, KVF_PAGE_HELD); dst[r] = KVF_DREQ_DRAINING; m_cancel[MI(r, dep[r])] = 1 }
#endif

/*
 * Hold timeout on a DRAINING request: time alone frees nothing. HELD → QUARANTINED, and the
 * engine is asked to fence the peer (the Fence step below may now run at any time).
 */
#ifdef MUTANT_FREE_AT_HOLD_TIMEOUT
#define D_HOLD_TIMEOUT(r) \
    :: d_step { dst[r] == KVF_DREQ_DRAINING && ALLPG(r, KVF_PAGE_HELD) -> /* bug: frees */ \
        set_pages(r, KVF_PAGE_FREE); dst[r] = KVF_DREQ_FAILED }
#else
#define D_HOLD_TIMEOUT(r) \
    :: d_step { dst[r] == KVF_DREQ_DRAINING && ALLPG(r, KVF_PAGE_HELD) -> \
        set_pages(r, KVF_PAGE_QUARANTINED) }
#endif

/*
 * A RUNNING request decodes: it reads every reserved page (P2), finishes and releases its pages:
 * OWNED → FREE, KVF_DREQ_DONE. Reading is its own step, so a late write may land between commit
 * and read.
 */
#define D_READ(r) \
    :: d_step { dst[r] == KVF_DREQ_RUNNING -> \
        read_page(r, 0); \
        if \
        :: NEED(r) == 2 -> read_page(r, 1) \
        :: else -> skip \
        fi; \
        set_pages(r, KVF_PAGE_FREE); dst[r] = KVF_DREQ_DONE }

/*
 * Fence of request r's grants (part of the Fence step): the attempt fails and its pages return
 * to FREE. The mutant revokes only the grants of a request whose pages were quarantined (the
 * request that asked for the fence); every other request keeps its grants of the fenced epoch.
 */
#ifdef MUTANT_FENCE_KEEPS_OTHER_GRANTS
#define FENCE_HITS(r) (dst[r] == KVF_DREQ_DRAINING && ALLPG(r, KVF_PAGE_QUARANTINED))
#else
#define FENCE_HITS(r) \
    ((dst[r] == KVF_DREQ_GRANTED || dst[r] == KVF_DREQ_DRAINING) && dep[r] < depoch)
#endif
inline fence_request(r) {
    if
    :: FENCE_HITS(r) -> set_pages(r, KVF_PAGE_FREE); dst[r] = KVF_DREQ_FAILED; GC_D(r, dep[r])
    :: else -> skip
    fi
}

proctype Decode() {
    byte i;
end:
    do
    D_ADMIT(0)
    D_ADMIT(1)
    D_DONE(0, 0, 1)
    D_DONE(0, 0, 2)
    D_DONE(0, 1, 1)
    D_DONE(0, 1, 2)
    D_DONE(1, 0, 1)
    D_DONE(1, 1, 1)
    D_PROOF(0, 0, m_reject, true)
    D_PROOF(0, 1, m_reject, true)
    D_PROOF(1, 0, m_reject, true)
    D_PROOF(1, 1, m_reject, true)
    D_PROOF(0, 0, m_fail, true)
    D_PROOF(0, 1, m_fail, true)
    D_PROOF(1, 0, m_fail, true)
    D_PROOF(1, 1, m_fail, true)
    D_LATE_DONE(0, 0, 1)
    D_LATE_DONE(0, 0, 2)
    D_LATE_DONE(0, 1, 1)
    D_LATE_DONE(0, 1, 2)
    D_LATE_DONE(1, 0, 1)
    D_LATE_DONE(1, 1, 1)
    D_PROOF(0, 0, m_ack, dst[0] == KVF_DREQ_DRAINING)
    D_PROOF(0, 1, m_ack, dst[0] == KVF_DREQ_DRAINING)
    D_PROOF(1, 0, m_ack, dst[1] == KVF_DREQ_DRAINING)
    D_PROOF(1, 1, m_ack, dst[1] == KVF_DREQ_DRAINING)
    D_CANCEL(0)
    D_CANCEL(1)
    D_HOLD_TIMEOUT(0)
    D_HOLD_TIMEOUT(1)
    D_READ(0)
    D_READ(1)
    /*
     * Fence, once a page is quarantined (a hold timeout, or a peer failure that quarantined the
     * pages of its requests), at most NFENCE times: force-close the endpoint so that no write of
     * the old epoch can land any more (in-flight writes are dropped), bump the epoch, and only
     * then revoke the epoch's grants, failing every request that held one. The prefill notices
     * the closed endpoint and handshakes again at the new epoch (KVF_MSG_HELLO) in the same step:
     * every attempt of the old epoch is forgotten (its grants died with the epoch) and messages
     * to prefill of the old epoch are dropped. Messages to decode of the old epoch stay in the
     * network: decode must ignore them.
     */
    :: d_step { nfences < NFENCE && (pgst[0] == KVF_PAGE_QUARANTINED ||
                pgst[1] == KVF_PAGE_QUARANTINED || pgst[2] == KVF_PAGE_QUARANTINED) ->
        nfences++;
        depoch++;
        for (i : 0 .. NP * NR * NE - 1) { wr[i] = 0 };
        i = 0;
        fence_request(0);
        fence_request(1);
        m_grant[MI(0, 0)] = 0; m_grant[MI(1, 0)] = 0;
        m_cancel[MI(0, 0)] = 0; m_cancel[MI(1, 0)] = 0;
        if
        :: pst[0] != KVF_PREQ_NONE -> pst[0] = KVF_PREQ_CLEARED; pn[0] = 0; pph[0] = 0; powe[0] = 0
        :: else -> skip
        fi;
        if
        :: pst[1] != KVF_PREQ_NONE -> pst[1] = KVF_PREQ_CLEARED; pn[1] = 0; pph[1] = 0; powe[1] = 0
        :: else -> skip
        fi;
        if
        :: sown != NONE_R -> sown = NONE_R; sdata = NONE_R
        :: else -> skip
        fi }
    od
}

/* ======================================================================================= */
/* Prefill: the prefill worker's side of the handoff (src/proto prefill machine).          */
/* ======================================================================================= */

/* Post a put of token pn[r] towards the granted page (the data put, the ordering fence and the
 * trailer put are one write here). */
inline post_put(r) {
    if
    :: true -> wr[WI(PG(r, pn[r]), r, depoch)] = 1
    fi;
    pn[r]++
}

/*
 * GRANT(r, e) for an attempt prefill has not seen (a later epoch than its record, or none): take
 * it, KVF_PREQ_NONE/CLEARED → KVF_PREQ_COMPUTING; or refuse it before posting anything (own
 * limits, pool exhausted): REJECT, KVF_PREQ_CLEARED. The mutant hands off a one-token placeholder
 * instead of rejecting. A GRANT for a known or tombstoned attempt is a duplicate: ignored.
 */
#ifdef MUTANT_PLACEHOLDER_AFTER_REJECT
#define P_REFUSE(r, e) pph[r] = 1; pst[r] = KVF_PREQ_COMPUTING   /* bug: placeholder handoff */
#else
#define P_REFUSE(r, e) m_reject[MI(r, e)] = 1; pst[r] = KVF_PREQ_CLEARED
#endif
#define P_GRANT(r, e) \
    :: atomic { m_grant[MI(r, e)] && depoch == (e) && (pst[r] == KVF_PREQ_NONE || pep[r] < (e)) -> \
        pep[r] = e; pn[r] = 0; pph[r] = 0; powe[r] = 0; m_grant[MI(r, e)] = 0; \
        if \
        :: pst[r] = KVF_PREQ_COMPUTING \
        :: P_REFUSE(r, e) \
        fi }

/*
 * CANCEL(r, e). Acked at once when nothing of the attempt can still land: an attempt never seen
 * (recorded as a CLEARED tombstone so that a late GRANT is ignored), one still computing, one
 * whose DONE was sent, or a CLEARED one (which drained before it was cleared). A posting or
 * flushing attempt stops posting and drains first (KVF_PREQ_DRAINING, owing the ack); a draining
 * one now owes the ack too, unless it already owes FAIL (the same proof).
 */
#ifdef MUTANT_ACK_BEFORE_DRAIN
#define P_CANCEL_POSTING(r, e) m_ack[MI(r, e)] = 1; pst[r] = KVF_PREQ_CLEARED; pn[r] = 0 /* bug */
#else
#define P_CANCEL_POSTING(r, e) pst[r] = KVF_PREQ_DRAINING; powe[r] = OWE_ACK; pn[r] = 0
#endif
#define P_CANCEL(r, e) \
    :: d_step { m_cancel[MI(r, e)] && depoch == (e) -> \
        m_cancel[MI(r, e)] = 0; \
        if \
        :: pst[r] == KVF_PREQ_NONE || pep[r] < (e) -> \
            pep[r] = e; pst[r] = KVF_PREQ_CLEARED; m_ack[MI(r, e)] = 1; m_grant[MI(r, e)] = 0 \
        :: else -> \
            if \
            :: pst[r] == KVF_PREQ_COMPUTING || pst[r] == KVF_PREQ_DONE || \
               pst[r] == KVF_PREQ_CLEARED -> \
                pst[r] = KVF_PREQ_CLEARED; m_ack[MI(r, e)] = 1 \
            :: pst[r] == KVF_PREQ_WRITING || pst[r] == KVF_PREQ_FLUSHING -> \
                P_CANCEL_POSTING(r, e) \
            :: pst[r] == KVF_PREQ_DRAINING && powe[r] == OWE_NONE -> \
                powe[r] = OWE_ACK \
            :: else -> skip \
            fi \
        fi }

/*
 * The attempt's own steps.
 * - COMPUTING → WRITING once the prompt's KV is computed into the source buffer (one buffer, so a
 *   second request waits for it).
 * - WRITING: post the next put; after the last, KVF_PREQ_FLUSHING (the mutant frees the source
 *   here, while the puts still read it). A short completion (fault injection: a prefill that
 *   reports fewer tokens than reserved, honestly counted) may stop posting early.
 * - FLUSHING → DONE when every posted write completed remotely (landed, or was dropped by a
 *   fence: a writer cannot tell): DONE(r, nonce, tokens_written).
 * - FLUSHING → DRAINING owing FAIL when the prefill fails after posting (a fault of its own;
 *   failing earlier is the same step with fewer writes).
 * - WRITING (after a post) or FLUSHING → DRAINING owing nothing: the request is cleared early
 *   (H2: its client side is done with it) while writes may be outstanding. The mutant
 *   ack_lost_when_cleared clears it at once instead (KVF_PREQ_CLEARED with writes outstanding),
 *   so that a later CANCEL is acked before those writes completed.
 * - DRAINING → CLEARED when every posted write completed remotely, sending what it owes:
 *   CANCEL_ACK or FAIL. CLEARED keeps the (request, nonce) record.
 * - The source buffer is released once its request posts no more and no put reads it.
 */
#ifdef MUTANT_ACK_LOST_WHEN_CLEARED
#define P_CLEAR(r) pst[r] = KVF_PREQ_CLEARED     /* bug: cleared with writes outstanding */
#else
#define P_CLEAR(r) pst[r] = KVF_PREQ_DRAINING; powe[r] = OWE_NONE
#endif
#ifdef MUTANT_SRC_FREED_AT_POST
#define P_LAST_POST(r) sown = NONE_R    /* bug: source freed when the last put is posted */
#else
#define P_LAST_POST(r) skip
#endif
#ifdef MUTANT_PLACEHOLDER_AFTER_REJECT
#define P_SHORT_OK(r) (pph[r] && pn[r] == 1)
#elif defined(UNVERIFIED)
#define P_SHORT_OK(r) false /* a short handoff is what the count check sees: unverified, none */
#else
#define P_SHORT_OK(r) (pn[r] >= 1)
#endif
#define P_STEPS(r) \
    :: d_step { pst[r] == KVF_PREQ_COMPUTING && sown == NONE_R -> \
        sown = r; sdata = r; pst[r] = KVF_PREQ_WRITING } \
    :: d_step { pst[r] == KVF_PREQ_WRITING && pn[r] < NEED(r) && !(pph[r] && pn[r] == 1) -> \
        post_put(r); \
        if \
        :: pn[r] == NEED(r) -> pst[r] = KVF_PREQ_FLUSHING; P_LAST_POST(r) \
        :: else -> skip \
        fi } \
    :: d_step { pst[r] == KVF_PREQ_WRITING && pn[r] < NEED(r) && P_SHORT_OK(r) -> \
        pst[r] = KVF_PREQ_FLUSHING } \
    :: d_step { pst[r] == KVF_PREQ_FLUSHING && NOWR(r, pep[r]) -> \
        m_done[DI(r, pep[r], pn[r])] = 1; pst[r] = KVF_PREQ_DONE; pn[r] = 0 } \
    :: d_step { pst[r] == KVF_PREQ_DRAINING && NOWR(r, pep[r]) -> \
        if \
        :: powe[r] == OWE_FAIL -> m_fail[MI(r, pep[r])] = 1 \
        :: powe[r] == OWE_ACK -> m_ack[MI(r, pep[r])] = 1 \
        :: else -> skip \
        fi; \
        powe[r] = OWE_NONE; pst[r] = KVF_PREQ_CLEARED } \
    :: d_step { pst[r] == KVF_PREQ_FLUSHING -> \
        powe[r] = OWE_FAIL; pst[r] = KVF_PREQ_DRAINING; pn[r] = 0 } \
    :: d_step { (pst[r] == KVF_PREQ_WRITING && pn[r] >= 1) || pst[r] == KVF_PREQ_FLUSHING -> \
        P_CLEAR(r); pn[r] = 0 } \
    :: d_step { sown == r && pst[r] != KVF_PREQ_WRITING && NOWR(r, depoch) -> \
        sown = NONE_R; sdata = NONE_R }

proctype Prefill() {
end:
    do
    P_GRANT(0, 0)
    P_GRANT(0, 1)
    P_GRANT(1, 0)
    P_GRANT(1, 1)
    P_CANCEL(0, 0)
    P_CANCEL(0, 1)
    P_CANCEL(1, 0)
    P_CANCEL(1, 1)
    P_STEPS(0)
    P_STEPS(1)
    od
}

/* ======================================================================================= */
/* Wire: a posted put completes — it reads the source buffer and lands in the decode page.  */
/* ======================================================================================= */

/*
 * A write of the current (unfenced) epoch lands: the page's bytes become the source buffer's
 * current contents and its trailer names (r, tag). P1: the page is still granted to exactly this
 * attempt. P4: the bytes are r's.
 */
#define W_LAND(p, r) \
    :: d_step { wr[WI(p, r, depoch)] -> \
        ASSERT_P1((pgst[p] == KVF_PAGE_GRANTED || pgst[p] == KVF_PAGE_HELD || \
                   pgst[p] == KVF_PAGE_QUARANTINED) && pgown[p] == r && pgep[p] == depoch); /* P1 */ \
        ASSERT_P4(sdata == r);                                                              /* P4 */ \
        wr[WI(p, r, depoch)] = 0; \
        cq[p] = sdata; ce[p] = depoch }

/*
 * Fault injection (H9): a transport reports a put complete although its bytes never arrived. The
 * writer sees the put complete; the page keeps whatever it held. Only the per-page checksum and
 * trailer check can tell.
 */
#define W_LOSE(p, r) \
    :: d_step { wr[WI(p, r, depoch)] -> wr[WI(p, r, depoch)] = 0 }

proctype Wire() {
end:
    do
#ifdef FORGE_FENCED
    /* A forged DONE of the fenced epoch 0 (NFENCE = 1), for each request, counting its tokens. */
    :: d_step { depoch > 0 && !m_done[DI(0, 0, 2)] -> m_done[DI(0, 0, 2)] = 1 }
    :: d_step { depoch > 0 && !m_done[DI(1, 0, 1)] -> m_done[DI(1, 0, 1)] = 1 }
#endif
    W_LAND(0, 0)
    W_LAND(0, 1)
    W_LAND(1, 0)
    W_LAND(1, 1)
    W_LAND(2, 0)
    W_LAND(2, 1)
#ifndef UNVERIFIED
    W_LOSE(0, 0)
    W_LOSE(0, 1)
    W_LOSE(1, 0)
    W_LOSE(1, 1)
    W_LOSE(2, 0)
    W_LOSE(2, 1)
#endif
    od
}

init {
    byte i;
    atomic {
        for (i : 0 .. NP - 1) {
            pgst[i] = KVF_PAGE_FREE; pgown[i] = NONE_R; cq[i] = NONE_R
        };
        i = 0;
        dst[0] = KVF_DREQ_NONE; dst[1] = KVF_DREQ_NONE;
        pst[0] = KVF_PREQ_NONE; pst[1] = KVF_PREQ_NONE;
        run Decode(); run Prefill(); run Wire()
    }
}
