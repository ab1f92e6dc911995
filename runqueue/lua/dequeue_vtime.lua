-- dequeue_vtime (scheduler flag on): ack the runs the call carries, then
-- serve up to maxCount ready runs of one base queue in fair virtual-time
-- order across its variants (start-time fair queuing; vtime/ is the model
-- this follows phase by phase: capacity, promote, ungate, discover, serve,
-- persist, rebase, expired), each moved in flight with a lease. Every serve
-- re-decides, so a variant may be served several times in one call and a
-- call of N serves what N calls of 1 would.
--
-- KEYS[1..11], ARGV[1..13+3a] -> see lib/dequeue
-- KEYS[12] -> queue ckVtime ZSET (see lib/sched_reg)
-- KEYS[13] -> queue scheduler state HASH (see lib/sched_reg)
-- KEYS[14] -> queue weights HASH (variant member -> weight)
-- ARGV[14+3a] -> scheduler state TTL (ms)
-- ARGV[15+3a] -> idle set cap
-- ARGV[16+3a] -> window multiplier
-- ARGV[17+3a] -> 1 when a freed slot looks for a gated variant (see
--                lib/hooks_vtime), else 0
-- KEYS[15] -> the env's waiting line ZSET (see lib/envwait), only with an env limit
-- KEYS[16] -> the line's HASH of lives and places, only with an env limit
-- ARGV[18+3a] -> the shard's wake-up channel, only with an env limit
-- ARGV[19+3a] -> the life of the call's waiting mark (ms), only with an env
--                limit; negative from a consumer leaving (maxCount 0: see
--                lib/envwait's ew_leave)
-- ARGV[20+3a] -> the leaving grace (ms), only with an env limit: a mark
--                with no more life left is passed over (lib/envwait)
-- Returns: see dq_finish (its first value -1 - the acks when the call found
-- the state broken and served nothing: see w_extend).
--@include record
--@include held
--@include sched
--@include place
--@include dequeue
--@include span
--@include envwait
local OWN_KEYS = 11
local dq = dq_open(KEYS, ARGV)
local S = sched_open(KEYS[OWN_KEYS + 1], KEYS[OWN_KEYS + 2], KEYS[OWN_KEYS + 3],
                     ARGV[dq.own_args + 1], ARGV[dq.own_args + 2], dq.now)
local wm = ARGV[dq.own_args + 3] + 0
local G = SCHED.G
-- capacity: the acks the call carries first (their slots count), then
-- what the env and queue limits leave of maxCount. The acks look for gated
-- variants as every flag-on ack does (see hooks_vtime): before the
-- capacity return and the promotion, which must see them un-gated.
local acked = {}
if dq.acks > 0 then -- (the hooks are closures: made only for acks)
  acked = dq_ack(dq, sched_hooks(S, dq.key_limit > 0 or ARGV[dq.own_args + 4] == '1'))
end
-- The env's free slots left to its queues that wait longer (lib/envwait).
dq_capacity(dq)
local ew = nil
if dq.env_limit > 0 then
  ew = ew_open(KEYS[OWN_KEYS + 4], KEYS[OWN_KEYS + 5], ARGV[dq.own_args + 5], ARGV[dq.own_args + 6],
               ARGV[dq.own_args + 7], dq)
  ew_capacity(ew)
end
if dq.cap <= 0 then
  if ew then ew_settle(ew, 0) end
  if S.st then sched_save(S) else sched_keep(S) end
  return dq_finish(dq, acked)
end
-- due TTL: whether the shard has runs past their TTL, which the call
-- sweeps when they come to the head of their variant (lib/dequeue's
-- dq_due and dq_head_due; vtime's sweepHead).
dq_due(dq)

-- promote: due delayed runs become ready; their variants register, all
-- together after it (nothing in the promotion reads the registrations).
-- lib/dequeue's dq_promote (head look, share plan, budget); when more
-- than scan variants are due, its pick looks at the first
-- 4 x scan (vtime.PromoteLook) and reaches first those with no ready run
-- (no ckIndex entry: nothing to serve until promoted), keeping scan/4
-- places for the others (whose due runs must not wait for ever either),
-- each group in delayIndex's order, one group filling the places the
-- other leaves (vtime's call.promote): a burst of many keys' delayed runs
-- falling due together no longer holds a key due behind it until every
-- earlier run is promoted. Those at their key limit with a ready run come
-- after all the others (and those without one after the others without
-- one), and while fewer than scan of those looked at are below their
-- limit the pick looks further (keys held at their limit
-- with due backlogs in front no longer shut a free key out).
-- The cold mark (vtime's call.promote): a call that reaches fewer variants
-- than are due (cut) on a cold state (the lane empty, no competing tag
-- above V) sets st.cm to the time the last of them fell due; a variant the promotion registers whose
-- first due run (its delayIndex score before the promotion) is at or
-- before the mark registers at V as a discovered one (found), not through
-- the lane: work due together on a cold state registers together, as if
-- the call had reached it all. A call that promotes and finds nothing due
-- by the mark left in delayIndex drops it (-1).
local promoted = sched_gather()
local cut, mark, found, last_due = false, -1, {}, -1
dq_promote(dq, promoted, function(look)
  cut = true
  -- (when the last of the due variants fell due, before any moves: the
  -- mark, not the call's own clock, which may run ahead of the producers')
  local last = redis.call('ZREVRANGEBYSCORE', dq.delay_index, dq.now_arg, '-inf', 'WITHSCORES', 'LIMIT', '0', '1')
  last_due = num(last[2])
  -- look holds the first scan + 1 due variants: read the rest of 4 x scan
  -- (vtime.PromoteLook); while those read hold fewer than scan below
  -- their key limit, the next 4 x scan, up to 10 looks, the last cut to
  -- 4,000 variants in all (vtime.PromoteLookMax: never less for a larger
  -- scan, so a coalesced call reaches as far as each of its calls)
  local scan = dq.scan
  local chunk = 4 * scan
  local reach = math.max(chunk, math.min(4000, 10 * chunk))
  local starving, fed, held_starving, held_fed = {}, {}, {}, {}
  local inflight = {} -- (read here, kept for those reached: dq_inflight)
  local function read(upto)
    if upto <= #look then return end
    local more = redis.call('ZRANGEBYSCORE', dq.delay_index, '-inf', dq.now_arg, 'LIMIT', #look, upto - #look)
    for i = 1, #more do look[#look + 1] = more[i] end
  end
  local function classify(from)
    for i = from, #look, 1000 do
      local to = math.min(i + 999, #look)
      -- (those at their key limit: nothing promoted for them can be
      -- served until a slot frees; with a ready run they have runs to
      -- serve then)
      local n = dq.key_limit > 0 and redis.call('HMGET', dq.kin, unpack(look, i, to))
      local heads = redis.call('ZMSCORE', dq.ck_index, unpack(look, i, to))
      for j = 1, #heads do
        local vm = look[i + j - 1]
        local g
        if n then inflight[vm] = tonumber(n[j]) or 0 end
        if n and inflight[vm] >= dq.key_limit then
          g = heads[j] and held_fed or held_starving
        else
          g = heads[j] and fed or starving
        end
        g[#g + 1] = vm
      end
    end
  end
  read(chunk)
  classify(1)
  local got = chunk
  while got < reach and #look == got and #starving + #fed < scan do
    local from = #look + 1
    got = math.min(reach, got + chunk)
    read(got)
    classify(from)
  end
  -- (the starving first, those below their limit before those at it,
  -- leaving scan/4 places to the fed below their limit when there are
  -- any, then those fed in the room left; then the fed at their limit)
  for _, vm in ipairs(held_starving) do starving[#starving + 1] = vm end
  for _, vm in ipairs(held_fed) do fed[#fed + 1] = vm end
  local s = math.min(#starving, scan - math.min(#fed, math.floor(scan / 4)))
  local f = math.min(#fed, scan - s)
  local due = {}
  for i = 1, s do due[i] = starving[i] end
  for i = 1, f do due[s + i] = fed[i] end
  for _, vm in ipairs(due) do
    if inflight[vm] then dq_var(dq, vm).inflight_n = inflight[vm] end
  end
  return due
end, function(due)
  -- the milli-weights of the variants to promote, in one read; the mark,
  -- and when it is set the first due run of each (before they move)
  local raw = sched_hmget(S.w, due)
  local ws = {}
  for i = 1, #due do ws[i] = sched_milli(raw[i]) end
  if S.st then mark = sched_state(S).cm else mark = tonumber(redis.call('HGET', S.h, 'cm')) or -1 end
  if mark >= 0 then
    for i = 1, #due, 1000 do
      local to = math.min(i + 999, #due)
      local at = redis.call('ZMSCORE', dq.delay_index, unpack(due, i, to))
      for j = 1, #at do
        if at[j] and num(at[j]) <= mark then found[due[i + j - 1]] = true end
      end
    end
  end
  return ws
end)
-- (cold as the state stood before the promotion's registrations, which
-- come next; nothing before them changed it)
local cold = false
if cut then
  local st0 = sched_state(S)
  cold = st0.lh == ''
  if cold then
    local t = redis.call('ZREVRANGEBYSCORE', S.z, SCHED.ACTIVE_END, '0', 'WITHSCORES', 'LIMIT', '0', '1')
    cold = not t[2] or num(t[2]) <= st0.v
  end
end
if promoted[1] then sched_register_many(S, promoted, found) end
-- A queue without scheduler state (never used, or idle past StateTTL) and
-- with no ready run makes none: nothing can be served, and the first work
-- that becomes ready starts the state. So a poll of an empty queue writes
-- nothing, as with the flag off. (The read is the one sched_state makes;
-- the EXISTS only runs when the state is missing.)
if not S.st then
  local r = redis.call('HMGET', S.h, unpack(SCHED_FIELDS))
  if not r[1] and redis.call('EXISTS', dq.ck_index) == 0 then
    if ew then ew_settle(ew, 0) end
    return dq_finish(dq, acked)
  end
  sched_state(S, r, 0)
end
local st = sched_state(S)
if cut and cold then
  st.cm = math.max(st.cm, last_due)
elseif mark >= 0 then
  local h = redis.call('ZRANGE', dq.delay_index, '0', '0', 'WITHSCORES')
  if not h[2] or num(h[2]) > mark then st.cm = -1 end
end

-- Milli-weights, read once per variant (none when the queue has none).
local milli = {}
local function weight_of(vm)
  if milli[vm] == nil then milli[vm] = sched_weight(S, st, vm) end
  return milli[vm]
end

-- Variants this call reads or changes: vm -> { vm, member, code, u (tag),
-- r (stride remainder, nil until needed), gated, gone, new, hv (state-hash
-- value to write) }, and the order they were first changed in.
local ent, changed = {}, {}
local function touch(e)
  if not e.touched then
    e.touched = true
    changed[#changed + 1] = e
  end
end

-- ungate: when the key limit rose above the one the gated variants were
-- gated under (or went away), every gated variant returns, at max(S, V);
-- those still at the new limit are gated again when a call meets them.
local kl = dq.key_limit
if st.gk > 0 and (kl == 0 or kl > st.gk) then
  local raw = redis.call('ZRANGEBYSCORE', S.z, SCHED.GS, '+inf')
  local vms = {}
  for i = 1, #raw do vms[i] = sched_split(raw[i]) end
  local hvs = sched_hmget(S.h, vms)
  local zargs, hargs = {}, {}
  for i = 1, #vms do
    local rg = hvs[i] and sched_parse(hvs[i]) or { code = select(2, sched_split(raw[i])), r = 0 }
    local u, r = rg.tag, rg.r
    if not u or u < st.v then u, r = st.v, 0 end
    zargs[#zargs + 1] = sched_fmt(u)
    zargs[#zargs + 1] = raw[i]
    hargs[#hargs + 1] = vms[i]
    hargs[#hargs + 1] = sched_value(rg.code, false, false, r)
  end
  sched_chunked('ZADD', S.z, zargs, 2)
  sched_chunked('HSET', S.h, hargs, 2)
  st.ng, st.gk, st.gp = st.ng - #vms, kl, 0
end

-- ungate, probe: the first gated variant in gating order (gp keeps the
-- number looked at) returns if it is below its limit (a flag-off instance
-- freed its slot without saying); one still at its limit takes the next
-- gating number, behind every other gated variant (written at persist,
-- after the serves: see there). One look per call: a call costs the same
-- whatever the number of gated keys; the gated variants are a queue the
-- probe takes from the front, and one gated later joins it at the back, so
-- keys gated again at every call never keep the probe from coming back to
-- a variant (vtime's probeGated).
local probe_back = nil -- { score, member } of the variant moved back
do
  local raw = {}
  if st.ng > 0 then
    raw = redis.call('ZRANGEBYSCORE', S.z, SCHED.GS, '+inf', 'WITHSCORES', 'LIMIT', '0', '1')
  end
  if #raw == 0 then
    st.gp = 0
  else
    local vm, code = sched_split(raw[1])
    st.gp = num(raw[2]) - G
    if not dq_at_limit(dq, vm) then
      local hv = redis.call('HGET', S.h, vm)
      local rg = hv and sched_parse(hv) or { r = 0 }
      local u, r = rg.tag, rg.r
      if not u or u < st.v then u, r = st.v, 0 end
      redis.call('ZADD', S.z, sched_fmt(u), raw[1])
      redis.call('HSET', S.h, vm, sched_value(code, false, false, r))
      st.ng = st.ng - 1
    else
      probe_back = { sched_fmt(G + st.gn), raw[1] }
      st.gn = st.gn + 1
    end
  end
end

-- discover: scan variants of ckIndex at the rotating cursor; untagged ones
-- register. The state's first read that finds any of ckIndex records the
-- call's time (b). An untagged variant whose head run (its first ready
-- run, which the read looks up: dq_head, its record's available_at) became
-- available at or before b had its work ready before the state could see
-- it and registers at V (or its parked tag); any other became ready while
-- the state was there (a flag-off producer's new key) and registers by the
-- newcomer rule, as a flag-on enqueue would have (see vtime's discover).
local index_empty
do
  local list = redis.call('ZRANGE', dq.ck_index, st.c, st.c + dq.scan)
  index_empty = st.c == 0 and #list == 0
  local more = #list > dq.scan -- one more was read to know
  if more then list[#list] = nil end
  if st.b < 0 and #list > 0 then st.b = dq.now end
  local hvs = sched_hmget(S.h, list)
  local found, ids = {}, {}
  for i, vm in ipairs(list) do
    if not hvs[i] then
      found[#found + 1] = vm
      -- (no head: a stale ckIndex entry, a hand edit's; no record, old work)
      local _, id = dq_head(dq, vm)
      ids[#found] = id or ''
    end
  end
  if #found > 0 then
    -- (one batch: one read of the records and of the parked tags, one top
    -- read, the writes after; each registration sees the ones before it)
    local recs = sched_hmget(dq.runs, ids)
    local parked = sched_mread('ZMSCORE', S.z, found)
    local B = sched_batch()
    for i, vm in ipairs(found) do
      -- (a record that does not parse, or is gone, counts as old work: the
      -- serve that meets it deals with it)
      local at = recs[i] and rec_parse(recs[i]).at
      sched_admit_into(S, st, vm, not at or at + 0 <= st.b, parked[i], B)
    end
    sched_chunked('ZREM', S.z, B.zrem, 1)
    sched_chunked('ZADD', S.z, B.zadd, 2)
    sched_chunked('HSET', S.h, B.hset, 2)
  end
  -- The next call starts cap entries before the end of this chunk: a serve
  -- moves at most one variant from before an unread one to after it, so
  -- no variant whose head stays put slips past the cursor.
  if not more then
    st.c = 0
  else
    st.c = st.c + math.max(1, dq.scan - dq.cap)
  end
end

local lane_head0 = st.lh -- the lane's head as the call begins (it competes)

-- serve, pass 1: the active tags in (tag, registration) order, read lazily
-- into a window (W), as vtime's window does. Nothing of ckVtime's active
-- region is written until persist, so reads by rank stay consistent.
-- W is a span (lib/span): the list's entries are list[head..tail].
local W = { list = {}, head = 1, tail = 0, over = {}, read = 0, more = true, last = nil, first = dq.cap + 1,
            budget = SCHED.READ_BUDGET + 4 * dq.max_count * wm }
-- (tag, registration) order; registration numbers compare as numbers.
local function before(a, b) return a.u < b.u or (a.u == b.u and a.seq < b.seq) end

-- A window entry for variant vm, seq code code, tag u.
local function entry(vm, code, u, member)
  return { vm = vm, member = member or code .. vm, code = code, seq = tonumber(code), u = u }
end

-- Put e in the list at its rank, whatever the bound.
local function w_place(e) span_place(W, e, before) end

-- Put e in the list when it sorts before the bound (the last entry read),
-- else in overflow until a read passes it; once the budget is spent no
-- read will, and e takes its rank in the list.
local function w_insert(e)
  if W.more and W.read > 0 and W.read < W.budget and before(W.last, e) then
    W.over[#W.over + 1] = e
    return
  end
  w_place(e)
end

local function w_remove(e)
  for i = W.head, W.tail do
    if W.list[i] == e then
      span_remove(W, i)
      return
    end
  end
end

-- Read the next chunk (first cap + 1 entries, then as many as were read,
-- within the budget; one more is peeked to know whether any are left).
-- The region's rank 0 is the sentinel: the first read takes it too and
-- returns nil when it is missing (a ckVtime lost without its hash).
local function w_extend()
  if not W.more or W.read >= W.budget then return false end
  local n = W.first
  if W.read > 0 then n = W.read end
  n = math.min(n, W.budget - W.read)
  local raw, skip = nil, 0 -- skip: values before the first entry
  if W.read == 0 then
    raw = redis.call('ZRANGEBYSCORE', S.z, '0', SCHED.ACTIVE_END, 'WITHSCORES', 'LIMIT', '0', n + 2)
    if raw[1] ~= '' then return nil end
    skip = 2 -- the sentinel and its score
  else
    raw = redis.call('ZRANGEBYSCORE', S.z, '0', SCHED.ACTIVE_END, 'WITHSCORES', 'LIMIT', W.read + 1, n + 1)
  end
  local got = (#raw - skip) / 2
  W.more = got > n
  local take = math.min(got, n)
  if take == 0 then return false end
  local e
  for i = 1, take do
    local member = raw[skip + 2 * i - 1]
    local vm, code = sched_split(member)
    e = entry(vm, code, num(raw[skip + 2 * i]), member)
    e.waiting = e.vm == lane_head0
    e.waiting0 = e.waiting
    ent[e.vm] = e
    W.tail = W.tail + 1
    W.list[W.tail] = e
  end
  W.read = W.read + take
  W.last = { u = e.u, seq = e.seq }
  local over = W.over
  W.over = {}
  for _, e in ipairs(over) do w_insert(e) end
  return true
end

-- The newcomer lane: its head competes, the others wait in registration
-- order (the lane region holds them all; nothing writes it before
-- persist, so ranks stay put). When the head leaves it, the next one
-- competes at max(V, t): t is its quantum past the old head's serve at
-- start (served), or the old head's tag (start).
local lane_left = 0
local function lane_leave(e, start, served)
  if not e.waiting then return end
  e.waiting = false
  st.lh = ''
  lane_left = lane_left + 1
  local nxt = sched_lane_at(S, lane_left)
  if not nxt then return end
  local t = start
  if served then t = t + sched_quantum(weight_of(nxt)) end
  local h = entry(nxt, sched_parse(redis.call('HGET', S.h, nxt)).code, math.max(st.v, t))
  h.r, h.r0, h.waiting, h.waiting0 = 0, 0, true, true
  st.lh = nxt
  ent[nxt] = h
  touch(h)
  w_insert(h)
end

local parked = {}
local function gate(e)
  e.gated, e.gate = true, st.gn
  st.gn = st.gn + 1
  st.gk = kl
  st.ng = st.ng + 1
  touch(e)
  lane_leave(e, e.u)
end

local function leave(e)
  e.gone = true
  touch(e)
  lane_leave(e, e.u)
  if e.u > st.v then
    e.parked = true
    parked[#parked + 1] = e
  end
end

-- The first servable entry; stale entries (no ready run: a flag-off drain
-- left them) are collected and those at their key limit gated, for good.
local function pick()
  while true do
    while W.head <= W.tail do
      local e = W.list[W.head]
      if dq_head(dq, e.vm) == nil then
        span_remove(W, W.head)
        leave(e)
      elseif dq_at_limit(dq, e.vm) then
        span_remove(W, W.head)
        gate(e)
      else
        return e
      end
    end
    if not w_extend() then return nil end
  end
end

-- serve, age head (once, when pass 1 runs dry): the first scan variants of
-- ckIndex as it stood when serving began (nothing writes it before
-- dq_finish) that this call has not seen and that still have a ready run:
-- untagged ones register at V or their parked tag, competing ones that
-- pass 1 did not reach (it stopped at its budget) join as they are, and
-- for one queued in the lane behind its head, the lane's head joins (the
-- lane keeps its order); all at their rank whatever the window's bound.
-- Gated ones are left to the probe, so an all-gated queue costs the same
-- whatever the number of keys.
local function age_head()
  local list = redis.call('ZRANGE', dq.ck_index, '0', dq.scan - 1)
  local need = {}
  for _, vm in ipairs(list) do
    if ent[vm] == nil then need[#need + 1] = vm end
  end
  local vals = sched_hmget(S.h, need)
  for i, vm in ipairs(need) do
    local rg = vals[i] and sched_parse(vals[i])
    -- (ent: the lane's head may have joined for a member met before it)
    if ent[vm] == nil and not (rg and rg.gated) and dq_head(dq, vm) ~= nil then
      local e
      if not rg then
        local u, code = sched_admit(S, st, vm, true)
        e = entry(vm, code, u)
        e.r, e.new = 0, true
        touch(e)
      elseif rg.waiting and vm ~= st.lh then
        local h = st.lh
        if h ~= '' and ent[h] == nil then
          local code = sched_parse(redis.call('HGET', S.h, h)).code
          e = entry(h, code, num(redis.call('ZSCORE', S.z, code .. h)))
          e.waiting, e.waiting0 = true, true
          vm = h
        end
      else
        e = entry(vm, rg.code, num(redis.call('ZSCORE', S.z, rg.code .. vm)))
        e.waiting, e.waiting0 = rg.waiting, rg.waiting
      end
      if e and e.u == nil then -- its tag went missing (a hand edit): at V
        e.u, e.r, e.r0 = st.v, 0, 0
        touch(e)
      end
      if e then
        ent[vm] = e
        w_place(e)
      end
    end
  end
end


-- The stride remainder of e: only a weight other than 1 leaves one.
local function remainder(e, mw)
  if e.r == nil then
    e.r = 0
    if mw ~= 1000 then
      local hv = redis.call('HGET', S.h, e.vm)
      if hv then e.r = sched_parse(hv).r end
    end
    e.r0 = e.r
  end
  return e.r
end

-- E = max(S, V), V = max(V, E), S = E + stride (exact: quotient and
-- remainder of 10^9 / milli-weight).
local function serve_one(e)
  w_remove(e) -- out of the window while its tag changes
  local mw = weight_of(e.vm)
  local eu, er = e.u, remainder(e, mw)
  if eu < st.v then eu, er = st.v, 0 end
  if eu > st.v then st.v = eu end
  if er >= mw then er = 0 end
  local q, r = sched_div(er + SCHED.STRIDE, mw)
  e.u, e.r = eu + q, r
  touch(e)
  -- The lane's head is served: it leaves the lane, and the next newcomer
  -- competes one quantum of its own behind this serve.
  lane_leave(e, eu, true)
  local nxt = dq_take(dq, e.vm)
  if nxt == nil then
    leave(e)
  elseif dq_at_limit(dq, e.vm) then
    gate(e)
  else
    w_insert(e)
  end
end

-- Sweep the head run of e's variant when its TTL passed (dq_head_due;
-- vtime's sweepOne): no serve, nothing of the scheduler moves;
-- the variant keeps its place in the window, or, when that was its last
-- ready run, leaves it as a stale entry does (pick).
local function sweep_one(e)
  if not dq_head_due(dq, e.vm) then return false end
  if dq_take(dq, e.vm, true) == nil then
    w_remove(e)
    leave(e)
  end
  return true
end

if w_extend() == nil then
  -- No sentinel: the state is broken. It goes whole, nothing is served,
  -- and the reply says so (its first value -1 - the acks) so that the
  -- caller calls again at once, on a state started again.
  sched_broken(S)
  local out = dq_finish(dq, acked)
  out[1] = -1 - out[1]
  return out
end
local age_done = index_empty -- nothing for the age head to read
while #dq.served - dq.nswept < dq.cap do
  local e = pick()
  if e == nil and not age_done then
    age_done = true
    age_head()
    e = pick()
  end
  if e == nil then break end
  if not sweep_one(e) then serve_one(e) end
end

-- The served runs move in flight first (dq_finish), the scheduler's writes
-- after: on a Redis at maxmemory a script is refused only at its first
-- write that may add memory, and a serve's first write removes runs from
-- their ready sets, so a full Redis still hands out runs, whose acks free
-- memory (as with the flag off).
local out = dq_finish(dq, acked)
if ew then ew_settle(ew, #dq.served - dq.nswept) end

-- collect and persist: the tags and registrations this call changed
-- (gathered from the entries it touched), then parked tags.
-- A variant that left the lane leaves its region (unless parking replaces
-- the entry: the member is the same).
do
  local zargs, hargs, zrem, hdel, iargs = {}, {}, {}, {}, {}
  for _, e in ipairs(changed) do
    if e.waiting0 and not e.waiting and not e.parked then zrem[#zrem + 1] = e.vm end
    if e.gone then
      if not e.new then
        zrem[#zrem + 1] = e.member
        hdel[#hdel + 1] = e.vm
      end
    else
      local score = e.u
      if e.gated then score = G + e.gate end
      zargs[#zargs + 1] = sched_fmt(score)
      zargs[#zargs + 1] = e.member
      if e.r == nil then
        -- Gated without a serve: keep the remainder it has.
        local hv = redis.call('HGET', S.h, e.vm)
        e.r = 0
        if hv then e.r = sched_parse(hv).r end
        e.r0 = e.r
      end
      local r = e.r
      if e.new or e.gated or r ~= (e.r0 or 0) or e.waiting ~= e.waiting0 then
        hargs[#hargs + 1] = e.vm
        hargs[#hargs + 1] = sched_value(e.code, e.gated, e.waiting, r, e.u)
      end
    end
  end
  for _, e in ipairs(parked) do
    iargs[#iargs + 1] = sched_fmt(e.u - G)
    iargs[#iargs + 1] = e.vm
  end
  if probe_back then -- (a gated variant: nothing above touched it)
    zargs[#zargs + 1] = probe_back[1]
    zargs[#zargs + 1] = probe_back[2]
  end
  sched_chunked('ZREM', S.z, zrem, 1)
  sched_chunked('HDEL', S.h, hdel, 1)
  sched_chunked('ZADD', S.z, zargs, 2)
  sched_chunked('HSET', S.h, hargs, 2)
  if #iargs > 0 then
    sched_chunked('ZADD', S.z, iargs, 2)
    sched_reap(S, st.v)
  end
end

-- rebase: once V reaches 2^49, every stored time moves down 2^48 (tags
-- more than 2^47 below V first rise to it: they are worth V either way).
if st.v >= SCHED.REBASE_AT then
  sched_reap(S, st.v)
  local lo = st.v - SCHED.REBASE_FLOOR
  local zargs, hargs = {}, {}
  local raw = redis.call('ZRANGEBYSCORE', S.z, '0', SCHED.ACTIVE_END, 'WITHSCORES')
  table.remove(raw, 1) -- the sentinel (rank 0) stays at 0
  table.remove(raw, 1)
  for i = 1, #raw, 2 do
    local u = num(raw[i + 1])
    if u < lo then
      u = lo
      local vm, code = sched_split(raw[i])
      hargs[#hargs + 1] = vm
      hargs[#hargs + 1] = sched_value(code, false, vm == st.lh, 0)
    end
    zargs[#zargs + 1] = sched_fmt(u - SCHED.REBASE_BY)
    zargs[#zargs + 1] = raw[i]
  end
  -- Gated tags live in the state hash (their scores are gating numbers).
  local gated = redis.call('ZRANGEBYSCORE', S.z, SCHED.GS, '+inf')
  local gvms = {}
  for i = 1, #gated do gvms[i] = sched_split(gated[i]) end
  local gvals = sched_hmget(S.h, gvms)
  for i, vm in ipairs(gvms) do
    if gvals[i] then
      local rg = sched_parse(gvals[i])
      local u, r = rg.tag or lo, rg.r
      if u < lo then u, r = lo, 0 end
      hargs[#hargs + 1] = vm
      hargs[#hargs + 1] = sched_value(rg.code, true, false, r, u - SCHED.REBASE_BY)
    end
  end
  local idle = redis.call('ZRANGEBYSCORE', S.z, SCHED.IDLE_MIN, SCHED.IDLE_END, 'WITHSCORES')
  for i = 1, #idle, 2 do
    zargs[#zargs + 1] = sched_fmt(num(idle[i + 1]) - SCHED.REBASE_BY)
    zargs[#zargs + 1] = idle[i]
  end
  sched_chunked('ZADD', S.z, zargs, 2)
  sched_chunked('HSET', S.h, hargs, 2)
  st.v = st.v - SCHED.REBASE_BY
  st.e = st.e + 1
end

-- expired: the runs taken whose TTL passed (dq_finish; not those swept)
-- free their slots
-- as an ack sent right after the call would (vtime's expireTaken): a
-- variant gated at its key limit for them competes again.
if dq.expired_vms and (kl > 0 or ARGV[dq.own_args + 4] == '1') then sched_released(S, dq.expired_vms, true) end

sched_save(S)
return out
