// Package vtime is the fair virtual-time scheduler of runqueue as a pure Go
// model: one base queue, its variants (one per concurrency key) and their
// runs, in memory, with time passed in by the caller. It imports no Redis
// code. It is the specification the flag-on Lua scripts of runqueue must
// match step by step; the differential tests drive the same operations
// through both and compare every served run and the whole scheduler state.
// The model also writes as an instance with the flag off does
// (EnqueueOff, DequeueOff, AckOff, NackOff, RecoverOff, RedriveOff: the
// runs move, the scheduler state does not), so that a rollout, where both
// kinds share a queue, is compared too.
// Whether the rules are fair is checked separately, against the guarantees
// below, by the oracle in internal/fairness.
//
// # Virtual time
//
// Virtual time is an integer number of units: a serve of a key of weight 1
// costs Unit (10^6) units. A weight w is applied as the milli-weight
// m = round(w*1000) (1..10^6), and a serve costs 10^9/m units, carried
// exactly: a key keeps the remainder of its last stride (below m), so its
// long-run share is exactly w/sum(w) whatever the history. A weight change
// (SetWeight) drops the remainder and caps the key's tag (competing, gated
// or parked; not a lane newcomer's) at V plus one serve at the new weight:
// what the key owes for serves at the old weight is at most one serve at
// the new one, and a tag below the cap stays (no credit). Tags are
// compared by their integer units. When the stored clock reaches 2^49, a
// rebase moves every stored time down by 2^48 and counts an epoch, so every
// value stays an exact integer of a double (the Lua's numbers) for ever:
// there is no precision horizon. The logical clock (V) is
// epoch*2^48 + stored V; it never decreases while the state exists.
//
// # State
//
//   - registrations: variant -> tag S (units), stride remainder, registration
//     number (seq), gated flag and gating number (the probe's order), and
//     waiting flag (in the newcomer lane).
//     Redis: ckVtime members "<seq code><member>" in its active or gated
//     region, the lane in its waiting region, and the state hash's
//     per-variant fields.
//   - V, the epoch, the discovery cursor, the next registration number,
//     gk (the key limit gated variants were gated under), the next gating
//     number, gp (the gating number the probe looked at last), and the
//     time of the state's first discovery read (b, see Registration): the
//     state hash.
//   - idle: variant -> tag parked when it drained (ckVtime's idle region).
//   - weights: variant -> milli-weight; configuration, not state.
//
// All of it but the weights lives and expires as one (ExpireState): the
// first writer makes it, the dequeues renew it (the other writers do not:
// with flag-off consumers nothing would collect what they register), and
// when it expires, it expires whole (the
// clock, the tags, the parked tags, the lane, the discovery cursor and the
// probe all start again; variants with ready work are rediscovered at V).
// In Redis the state is two keys; a writer that finds one without the
// other (an operator deleted one, an eviction took one) starts the state
// again as if it had expired.
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
// the stored tag, then by registration order. Then V = max(V, E) and
// S = E + stride. A dequeue of N makes N such decisions, so a variant may be
// served several times in one call.
//
// A call runs these phases (the Lua has the same names):
//
//   - capacity: what the env and queue limits leave of maxCount (cap); at 0
//     the call does nothing.
//   - promote: the due delayed runs of up to ScanLimit due variants become
//     ready, registering their variants: all of them when no more are due;
//     else, among the first PromoteLook x ScanLimit, those with no ready
//     run first, keeping ScanLimit/4 places for the others, each group in
//     the delay index's order (in each, those at their key limit after
//     those below it), one filling the places the other leaves; while
//     fewer than ScanLimit of those looked at are below their key limit,
//     it looks at PromoteLook x ScanLimit more, up to PromoteLookMore
//     looks, the last cut to PromoteLookCap variants in all
//     (PromoteLookMax, which never falls as the scan grows).
//     The call's budget,
//     max(PromoteLimit, maxCount), is spent on those variants by weight
//     (PromotePlanWeighted; the same shares, rounded up, for equal
//     weights): each takes up to ceil(budget x w / the variants' sum of w),
//     at most PromoteLimit; what that leaves goes to those that filled
//     their share by weighted water-filling (fillByWeight: what one cannot
//     take goes to the others by weight, not by name). Then the variants
//     at their key limit (held) keep what they took and the others take as
//     much again, filled the same way: the budget goes whole to the
//     variants the call can serve. So a call promotes fewer than 2 x
//     (budget + ScanLimit) runs however many are due, and a share one
//     variant leaves unused goes to others by weight. (A flag-off call's
//     plan, PromotePlan, shares evenly and gives what its second pass
//     leaves in order.)
//   - ungate: when the key limit rose above the one the gated variants were
//     gated under (or went away), every gated variant returns (those still
//     at the new limit are gated again when met): that call costs in
//     proportion to the gated variants, once per rise. And one gated
//     variant, the first in gating order, returns if it is below its limit
//     (an instance with the flag off freed its slot without saying); one
//     still at its limit takes the next gating number, behind every other
//     gated variant.
//   - discover: ScanLimit variants of ckIndex at a rotating cursor; those
//     without a tag register (at their parked tag or V). The cursor then
//     moves max(1, ScanLimit - cap): a serve moves at most one variant past
//     an unread one, so none whose head stays put slips past the cursor.
//     With ScanLimit at or below maxCount the cursor moves one variant a
//     call.
//   - serve, pass 1: the competing tags (registered, not gated, not queued
//     behind the lane's head) in order, read lazily
//     (first cap+1, then doubling, at most ReadBudget + 4*maxCount*
//     WindowMultiplier per call). An entry met with no ready run (stale: a
//     flag-off drain leaves one) is collected as a drained variant is; one
//     met at its key limit is gated. Both leave for good, so gated and stale
//     keys cost nothing on later calls. A serve that brings a variant to its
//     key limit gates it at once. An entry whose tag moves past the last
//     entry read waits until a read passes it; once the read budget is
//     spent, it takes its rank among what was read.
//   - serve, age head: when pass 1 finds nothing servable, the first
//     ScanLimit variants of ckIndex in age order as it stood when serving
//     began (what a flag-off call would serve) that the call has not seen
//     and that have a ready run join, once per call: untagged ones register
//     (at their parked tag or V), competing ones that pass 1 did not reach
//     (its budget ran out) come as they are, and for one queued in the lane
//     the lane's head comes (the lane keeps its order; its head is
//     servable or hands on); all at their rank whatever the window's
//     bound; then pass 1 goes on. Gated ones are left to the probe.
//   - collect and persist: drained variants park their tag when it is above
//     V; any operation that parks (a dequeue, a TTL sweep or another drain)
//     reaps the parked tags at or below V and caps the idle set to the
//     highest IdleMaxEntries (ties: member order).
//   - rebase, when V reaches 2^49.
//   - expired: each run taken whose TTL passed (SetTTL; never delivered,
//     its deadline at or before now) is deleted instead of delivered, its
//     slot freed as an ack frees it (Served.Expired). Most never get here:
//     a run past its TTL that comes to the head of its variant in pass 1
//     or the age head is swept there, up to TTLLook a call (Served.Swept):
//     no serve, no tag, clock or lane moves, not counted for cap or the
//     key's limit; a variant so emptied leaves as a stale entry does.
//
// # Registration
//
//   - Return (a parked tag above V exists): at the parked tag, which goes.
//     Draining and coming back never buys credit. A parked tag at or below
//     V is worth nothing: it goes, and the variant registers as below.
//   - Discovery (untagged work in ckIndex), when that work was ready before
//     the state began: at V. The state's first discovery read records its
//     call's time (b); a variant found untagged whose head run became
//     available at or before b registers at V, at any scale. Any other (a
//     flag-off producer's new key, a key written during a rollback that
//     kept the state) registers as a newcomer, below, as a flag-on
//     writer's enqueue would have (see discover). The age head registers
//     at V.
//   - Newcomer (any other first ready run: enqueue, nack, lease recovery,
//     redrive, promotion): newcomers go through a lane, one at a time.
//     A newcomer's quantum q is one serve of its own, at most Unit:
//     min(Unit, 10^9/m). When the lane is empty, let top be the highest tag
//     among the competing variants and A = min(top, V+q): the newcomer
//     registers at V when A <= V (nothing is ahead of the clock: cold
//     start, every key at V), else it becomes the lane's head at A+q: one
//     serve behind the pack, and a low-weight key's huge tag cannot push it
//     back (the cap at V+q). When the lane is not empty, the newcomer queues
//     behind it (in registration order) without a tag and takes no part in
//     the competition. When the head leaves the lane
//     (its first serve, or gated, drained or collected unserved), the next
//     newcomer becomes the head at max(V, t): t is the next head's quantum
//     past the old head's serve, or the tag of a head that left unserved.
//     So newcomers together get the share of one key (minting keys buys
//     nothing), and newcomers that expire, drain or are minted and gone
//     never push later ones back.
//   - Cold mark (a promotion of work due together on a cold state): a call
//     whose promotion reaches fewer variants than are due while the state
//     is cold (the lane empty, no competing tag above V) records as the
//     mark the time the last of the due variants fell due (not its own
//     clock, which may run ahead of the producers'); a variant a later promotion registers whose first due
//     run (its delay index score before the promotion) is at or before the
//     mark registers as a discovered one, at V, not through the lane. So
//     work due together on a cold state registers together, as if the
//     first call had reached all of it. A call that promotes and leaves
//     nothing due by the mark in the delay index drops it; the mark goes
//     with the state (see call.promote).
//
// Variants that register in the same call (promotion of runs due at the
// same time, discovery) register in their index order, whose exact ties
// are broken by name; so do variants the age head or discovery meet in
// later calls, when their oldest runs are equally old. That is the one
// place a name orders anything, and only among variants whose oldest work
// is equally old. Equal tags are ordered by registration number, never by
// name, whatever the server's locale.
//
// # Gating
//
// A variant at its per-key limit is out of the competition: it keeps its
// tag, and it competes again, at max(S, V) (gated time earns no credit),
// when a slot frees on a flag-on instance that has given a queue a
// per-key limit (ack, nack, lease recovery, dead letter, the acks of a
// fused ack-and-dequeue: at once, whatever the key limit is then), at the
// first call after its limit rose or went away, and otherwise (a flag-off
// instance, or a flag-on one that never had a key limit, freed the slot)
// when the gated probe comes to it: one variant per call in gating order;
// a variant gated later, and one the probe found still at its limit, go
// behind every other gated variant, so the gated variants are a queue the
// probe takes from the front, and each is looked at within as many calls
// as there are gated variants ahead of it, however often other keys are
// gated again meanwhile. (Without the move to the back, keys gated again
// at every call always left one ahead of the probe's place, which then
// never went back to the first: a variant looked at just before its slot
// was freed without a word waited for ever.) A call's
// cost does not depend on the number of gated variants: pass 1 never sees
// them and the probe looks at one (but for the call that sees a rise, see
// ungate above).
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
//     at most as good as when they left (but for a weight change, which
//     caps them at V plus one serve at the new weight, ceil(10^9/m): the
//     largest a serve at that weight leaves, the remainder carried).
//  4. Batch invariance: dequeue(N) == N x dequeue(1) when no discovery,
//     un-gating or age-head registration is pending, the pass-1 reads stay
//     within the budget and the due delayed runs fit in one call's
//     promotion (ScanLimit variants for maxCount 1).
//  5. Reachability: every untagged variant with ready work whose head
//     stays put is registered within ceil(variants/max(1, ScanLimit-
//     maxCount))+1 calls (a lap more for each variant before it that a TTL
//     sweep or a flag-off writer removed meanwhile), and every registered variant with
//     a ready head below its limit is served within the bounds of 1, 2
//     and 7. A variant below its key limit with due delayed runs and no
//     ready run, among the first PromoteLook x ScanLimit due variants
//     (or further, while fewer than ScanLimit of those are below their
//     limit, up to PromoteLookMore looks and PromoteLookCap variants), gains a ready run within
//     ceil(due variants/(ScanLimit-ScanLimit/4-maxCount)) calls when that
//     divisor is above 0, however long the bursts due before it last; one
//     with ready runs is reached earliest due first among those, in
//     ScanLimit/4 places a call at least. A variant at its key limit is
//     reached after those below theirs in its group.
//  6. Work conservation: a call stops early only when nothing it can reach
//     is servable; the age-head fallback reads what a flag-off call reads.
//     Flag on therefore serves whenever flag off would (but for a gated
//     variant whose slot a flag-off instance freed, until the probe comes
//     to it), and it may drain slower with per-key limits: fairness serves
//     the longest key later and it becomes the critical path (A with 3
//     runs, B, C, D with 1, key limit 1, runs held one call: age order
//     drains in 6 calls, the fair order in 7).
//  7. Newcomer bound: with equal weights (any equal weights), a key that
//     registers when the lane is empty is served within 3 serves per other active key,
//     whatever expired, drained, returned or was minted before it; the k-th
//     newcomer waiting in the lane, after about k rounds. A key whose
//     delayed work fell due by the cold mark counts as registered when it
//     fell due: the rest of a cold burst may be served before a newcomer
//     that came after it, each once a round.
package vtime
