// Package vtime is the fair virtual-time scheduler of runqueue as a pure Go
// model: one base queue, its variants (one per concurrency key) and their
// runs, in memory, with time passed in by the caller. It imports no Redis
// code. It is the specification the flag-on Lua scripts of runqueue must
// match step by step; the differential tests drive the same operations
// through both and compare every served run, every tag, the clock V and
// every parked tag.
//
// # State
//
//   - tags: variant -> S, its next virtual start tag (Redis: ckVtime).
//   - V: the queue's virtual clock; it never decreases (Redis: ckVtimeFloor).
//   - L: the tag given to the previous newcomer, and c: the discovery
//     cursor (both also in ckVtimeFloor).
//   - idle: variant -> tag parked when it drained (Redis: ckVtimeIdle).
//   - weights: variant -> weight, 0.001..1000, default 1.
//
// A variant is registered (has a tag) exactly while it has ready runs,
// when every writer runs with the flag on.
//
// # Serving
//
// Each serve picks, among the servable variants it can see (ready head,
// below its key limit), the one first in (S, name) order; since
// E = max(S, V) is monotone in S, that is the smallest effective start E
// (ties: the lower stored tag, then the name). Then V = max(V, E) and
// S = E + Quantum/weight. A dequeue of N runs N such serves, re-deciding
// after each one, so a variant may be served several times in one call and
// dequeue(N) serves what N calls of dequeue(1) would (see Batch invariance).
//
// What a call can see: the first 2*N*WindowMultiplier tags (pass 1; gated
// variants are skipped without using up anything) and, only when none of
// those is servable, the first S variants in age order (pass 2: lowest head
// ready score, then name), where S = ScanLimit, by default max(30, 3*N): the
// variants a flag-off dequeue looks at, so flag on serves whenever flag off
// would. A call promotes the due delayed runs of the first S due variants.
// A call that serves nothing writes nothing, except that promotion.
//
// # Registration
//
//   - Newcomer (a variant gains its first ready run through enqueue, nack,
//     lease recovery, redrive or promotion, and has no parked tag): let A be
//     the highest of {the highest tag capped at V+Quantum, L}; it registers at
//     A+Quantum when A > V, else at V; L becomes its tag. A newcomer thus
//     queues one quantum behind the pack (no Sybil lever: minting keys does
//     not jump the queue), while at cold start every key starts at V, and a
//     low-weight key with a huge tag cannot push newcomers back (the cap).
//   - Return (a parked tag exists): registers at max(V, parked) and the idle
//     entry is removed, so draining and coming back never buys credit.
//   - Discovery (repair): when ckIndex and ckVtime hold different numbers of
//     variants (work written with the flag off, expired state, or tags a
//     flag-off drain left behind), a call registers the
//     untagged variants among the first S in age order and among S more at
//     a rotating cursor, at max(V, parked) or V. The cursor makes every variant reachable in a bounded number of
//     calls whatever the age of its head.
//
// # Draining
//
// When a variant's last ready run leaves (served, expired), its tag is
// parked in idle if it is above V, and the variant leaves tags. Parked tags
// at or below V are worthless and are reaped, and idle is rank-capped to
// IdleMaxEntries (highest kept), by every call that parks a tag.
//
// # Guarantees (proved by tests on this model and on the Lua)
//
//  1. No-debt wait: a key registered at V is served before any key whose
//     tag is above V+Quantum: at most one serve per other active key.
//  2. Lag bound: two continuously backlogged keys i, j stay within
//     1/w_i + 1/w_j of each other in serves/weight at every prefix of the
//     serve sequence, inside batches too.
//  3. No credit for idle, gated or future-headed time: E = max(S, V).
//  4. Batch invariance: dequeue(N) == N x dequeue(1) whenever the first
//     2*WindowMultiplier tags hold a servable variant at every serve, no
//     discovery is pending and at most S variants (S for maxCount 1) have
//     due delayed runs waiting for promotion.
//  5. Reachability: with discovery, every ready, non-gated variant is served
//     within a bounded number of calls.
//  6. Work conservation within the windows: a call stops early only when
//     nothing it can see is servable, and it sees what a flag-off call sees
//     in age order, so flag on serves whenever flag off would. Flag on
//     therefore never drains slower than flag off, except with per-key
//     limits: then fairness, by serving the key with the longest backlog
//     later, can make that key's runs the critical path (A with 3 runs, B,
//     C, D with 1, key limit 1, runs held one call: age order drains in 6
//     calls, the fair order in 7).
package vtime
