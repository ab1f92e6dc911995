// Package vtime is the fair virtual-time scheduler of runqueue as a pure Go
// model: one base queue, its variants (one per concurrency key) and their
// runs, in memory, with time passed in by the caller. It imports no Redis
// code. It is the specification the flag-on Lua scripts of runqueue must
// match step by step; the differential tests drive the same operations
// through both and compare every served run and the whole scheduler state.
// Whether the rules are fair is checked separately, against the guarantees
// below, by the oracle in internal/fairness.
//
// # Virtual time
//
// Virtual time is an integer number of units: a serve of a key of weight 1
// costs Unit (10^6) units. A weight w is applied as the milli-weight
// m = round(w*1000) (1..10^6), and a serve costs 10^9/m units, carried
// exactly: a key keeps the remainder of its last stride (below m), so its
// long-run share is exactly w/sum(w) whatever the history. Tags are
// compared by their integer units. When the stored clock reaches 2^51, a
// rebase moves every stored time down by 2^50 and counts an epoch, so every
// value stays an exact integer of a double (the Lua's numbers) for ever:
// there is no precision horizon. The logical clock (V) is
// epoch*2^50 + stored V; it never decreases while the state exists.
//
// # State
//
//   - registrations: variant -> tag S (units), stride remainder, registration
//     number (seq) and gated flag (Redis: ckVtime members "<seq code><member>"
//     and the state hash's per-variant fields).
//   - V, the epoch, L (the previous newcomer's tag), the discovery cursor,
//     the next registration number, and gk/gs/gp (the gating limit, the
//     gated variants left to return after it rose, the gated probe's
//     rank): the state hash.
//   - idle: variant -> tag parked when it drained (ckVtime's idle region).
//   - weights: variant -> milli-weight; configuration, not state.
//
// All of it but the weights lives and expires as one (ExpireState): every
// writer refreshes it together, and when it expires, it expires whole.
//
// A variant is registered exactly while it has ready runs, when every
// writer runs with the flag on; it is gated while its in-flight runs reach
// the per-key limit.
//
// # Serving
//
// Each serve picks, among the registered variants that are not gated and
// have a ready run, the first in (S, seq) order; since the effective start
// E = max(S, V) is monotone in S, that is the smallest E, ties broken by
// the stored tag, then by registration order (never by name: a tenant
// chooses names, not when its keys registered). Then V = max(V, E) and
// S = E + stride. A dequeue of N makes N such decisions, so a variant may be
// served several times in one call.
//
// A call runs these phases (the Lua has the same names):
//
//   - capacity: what the env and queue limits leave of maxCount; at 0 the
//     call does nothing.
//   - promote: the due delayed runs of the first ScanLimit due variants
//     become ready (up to PromoteLimit each), registering their variants.
//   - ungate: after the key limit rose (or went away), the variants gated
//     under the lower limit return to the competition, UngateChunk per call;
//     and one gated variant, at a rotating rank, returns if it is below its
//     limit (an instance with the flag off freed its slot without saying).
//   - discover: ScanLimit variants of ckIndex at a rotating cursor; those
//     without a tag register (at max(V, parked) or V). Every call does it,
//     so every variant with ready work is reached within
//     ceil(variants/ScanLimit) calls, whatever stale state exists.
//   - serve, pass 1: the registered, non-gated tags in order, read lazily
//     (first maxCount+1, then doubling, at most ReadBudget + 4*maxCount*
//     WindowMultiplier per call). An entry met with no ready run (stale: a
//     flag-off drain leaves one) is collected as a drained variant is; one
//     met at its key limit is gated. Both leave for good, so gated and stale
//     keys cost nothing on later calls. A serve that brings a variant to its
//     key limit gates it at once.
//   - serve, age head: when pass 1 finds nothing servable, the untagged
//     variants among the first ScanLimit of ckIndex in age order (what a
//     flag-off call would serve) are registered, once per call, and pass 1
//     goes on.
//   - collect and persist: drained variants park their tag when it is above
//     V; parked tags at or below V are reaped and the idle set is capped to
//     the highest IdleMaxEntries.
//   - rebase, when V reaches 2^51.
//
// # Registration
//
//   - Return (a parked tag exists): at max(V, parked); the parked entry goes.
//     Draining and coming back never buys credit.
//   - Discovery (untagged work in ckIndex): at V (or the parked tag).
//   - Newcomer (any other first ready run: enqueue, nack, lease recovery,
//     redrive, promotion): let top be the highest tag among the registered,
//     non-gated variants; A = max(min(top, V+Unit), min(L, top)); it
//     registers at A+Unit when A > V, else at V, and L becomes its tag.
//     Newcomers thus queue one quantum behind the pack and behind each other
//     (minting keys buys the share of one key), at cold start every key
//     starts at V, a low-weight key's huge tag cannot push them back (the cap
//     at V+Unit), and the anchor L can never be above a tag registered now,
//     so expired, drained or minted-and-gone keys cannot push later
//     newcomers back.
//
// # Gating
//
// A variant at its per-key limit is out of the competition: it keeps its
// tag, and it competes again, at max(S, V) (gated time earns no credit),
// when a slot frees (ack, nack, lease recovery, dead letter: at once),
// within ceil(gated/UngateChunk) calls of its limit rising, and, when a
// flag-off instance freed the slot, when the probe or the age head finds it
// below its limit (within gated+1 calls). A call's cost does not depend on
// the number of gated variants: pass 1 never sees them and the probe looks
// at one.
//
// # Guarantees (checked by the oracle on observed schedules, on this model
// and on the Lua)
//
//  1. No-debt wait: a key registered at V is served before any other key is
//     served twice: at most one serve per other active key.
//  2. Lag bound: two keys i, j continuously servable over an interval of the
//     serve sequence get n_i, n_j serves with |n_i/w_i - n_j/w_j| <=
//     1/w_i + 1/w_j (plus 2 units of rounding in the tie order), inside
//     batches too.
//  3. No credit for idle, gated or delayed time: E = max(S, V), parked tags
//     at most as good as when they left.
//  4. Batch invariance: dequeue(N) == N x dequeue(1) when no discovery,
//     un-gating or age-head registration is pending, the pass-1 reads stay
//     within the budget and the due delayed runs fit in one call's
//     promotion (ScanLimit variants for maxCount 1).
//  5. Reachability: every variant with a ready head below its limit is
//     registered within ceil(variants/ScanLimit) calls and then served
//     within the bounds of 1, 2 and 10.
//  6. Work conservation: a call stops early only when nothing it can reach
//     is servable; the age-head fallback reads what a flag-off call reads.
//     Flag on therefore serves whenever flag off would, but it may drain
//     slower with per-key limits: fairness serves the longest key later and
//     it becomes the critical path (A with 3 runs, B, C, D with 1, key
//     limit 1, runs held one call: age order drains in 6 calls, the fair
//     order in 7).
//  7. Newcomer bound: with equal weights, a key that registers when every
//     registered key has been served since it registered (no earlier
//     newcomer still waits) is served within 3 serves per other active key,
//     whatever expired, drained or was minted before it. Newcomers that
//     arrive together queue behind each other, one round each.
package vtime
