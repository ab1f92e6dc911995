-- The machinery both dequeue scripts share, as functions over one call's
-- state dq: binding its keys and arguments, the acks a call may carry (the
-- fused ack-and-dequeue), the capacity the env and queue limits leave,
-- promotion of due delayed runs, reading variants' heads, taking runs, and
-- moving the taken runs in flight (dq_finish).
--
-- KEYS and ARGV of a dequeue script (both flag states):
-- KEYS[1] -> queue ckIndex ZSET (variant member, score head ready score ms)
-- KEYS[2] -> queue delayIndex ZSET (variant member, score earliest available_at ms)
-- KEYS[3] -> queue depth HASH (r, d)
-- KEYS[4] -> shard master ZSET (queue member, score earliest work ms)
-- KEYS[5] -> shard leases ZSET (run member, score lease deadline ms)
-- KEYS[6] -> env in-flight counter STRING
-- KEYS[7] -> queue held HASH ("<variant member>:<encoded id>" -> delivery token)
-- KEYS[8] -> queue runs HASH (encoded id -> record)
-- KEYS[9] -> queue key-inflight HASH (variant member -> runs in flight)
-- KEYS[10] -> shard delivery token counter STRING
-- KEYS[11] -> shard ttl ZSET (run member, score expiry deadline ms)
-- ARGV[1] -> now (ms)
-- ARGV[2] -> maxCount (0..2000; 0: acks only)
-- ARGV[3] -> env concurrency limit, 0 for none
-- ARGV[4] -> queue concurrency limit (all keys), 0 for none
-- ARGV[5] -> per-key concurrency limit, 0 for none
-- ARGV[6] -> lease deadline (ms)
-- ARGV[7] -> queue member
-- ARGV[8] -> run member prefix (encoded env ":" encoded queue ":")
-- ARGV[9] -> priority step (ms)
-- ARGV[10] -> scan: age-order entries read, due delayed variants promoted
-- ARGV[11] -> promote limit: runs promoted per variant per call
-- ARGV[12] -> variant key base (keys.Queue.VariantBase)
-- ARGV[13] -> a, the number of runs to ack first (at most 1000)
-- ARGV[14+3i..16+3i] -> ack i: variant member, encoded id, delivery token
--
-- Variant keys are derived from the variant member (lib/place's
-- variant_keys), in the queue's hash slot.
-- (now_arg is now as the client sent it, for commands: a Lua number
-- argument costs Redis a %.17g format, some 2,700 instructions on Redis
-- 7.0, and a constant one is written as a string for the same reason.)
local function dq_open(keys, args)
  -- Effects replication, before the first write, for the TIME dq_finish
  -- reads (the token counter's floor): Redis 6.2 run with
  -- lua-replicate-commands no refuses every write after TIME, which would
  -- leave a call's served runs out of their ready sets but never in flight.
  -- Redis 7 always replicates effects and keeps the call as a no-op.
  if redis.replicate_commands then redis.replicate_commands() end
  local acks = args[13] + 0
  local dq = {
    ck_index = keys[1], delay_index = keys[2], depth = keys[3], master = keys[4], leases = keys[5],
    env_n = keys[6], held = keys[7], runs = keys[8], kin = keys[9], tokens = keys[10], ttl = keys[11],
    now = args[1] + 0, now_arg = args[1], max_count = args[2] + 0, env_limit = args[3] + 0,
    queue_limit = args[4] + 0, key_limit = args[5] + 0, lease_deadline = args[6],
    qm = args[7], run_prefix = args[8], priority_step = args[9] + 0, scan = args[10] + 0,
    promote_limit = args[11] + 0, vbase = args[12], acks = acks, own_args = 13 + 3 * acks,
    vars = {},     -- variant member -> { ready, delayed keys; head cache; counts }
    touched = {},  -- variant members in first-serve order
    served = {},   -- ids served, in serve order
    served_vm = {}, -- their variant members
    swept = {},    -- places in served of the runs swept at their head (dq_take)
    nswept = 0,    -- how many (they do not count for cap)
    sweep_room = 0, -- runs it may sweep: DQ_TTL_LOOK when the shard has one due (dq_due)
    dirty = false, -- promotion wrote something
    -- (set later; named here so that the table is made at its full size
    -- once, not grown past 32 fields by a rehash)
    cap = 0, delay_head = nil, ck_head = nil,
  }
  return dq
end

-- The acks the call carries, before anything else: their slots count for
-- this call's capacity.
local function dq_ack(dq, hooks)
  if dq.acks == 0 then return {} end
  return held_ack({ runs = dq.runs, held = dq.held, kin = dq.kin, env_n = dq.env_n, leases = dq.leases },
    dq.run_prefix, ARGV, 14, dq.acks, dq.now, hooks)
end

-- What the env and queue limits leave of maxCount.
local function dq_capacity(dq)
  local cap = dq.max_count
  if cap > 0 and dq.env_limit > 0 then
    cap = math.min(cap, dq.env_limit - (tonumber(redis.call('GET', dq.env_n)) or 0))
  end
  if cap > 0 and dq.queue_limit > 0 then cap = math.min(cap, dq.queue_limit - held_count(dq.held)) end
  dq.cap = cap
  return cap
end

-- How many runs past their TTL a call sweeps at most (vtime.TTLLook).
local DQ_TTL_LOOK = 100

-- Whether the call may sweep: one read of the shard's TTL set, for an
-- entry due by now (the common case: none, and no head is looked up).
local function dq_due(dq)
  if redis.call('ZRANGEBYSCORE', dq.ttl, '-inf', dq.now_arg, 'LIMIT', '0', '1')[1] then
    dq.sweep_room = DQ_TTL_LOOK
  end
end

local function dq_var(dq, vm)
  local c = dq.vars[vm]
  if c == nil then
    c = variant_keys(dq.vbase, vm)
    c.taken = 0
    dq.vars[vm] = c
  end
  return c
end

-- Move up to n due runs of variant vm from delayed to ready; returns how
-- many left the delayed set.
local function dq_promote_variant(dq, hooks, vm, n)
  local c = dq_var(dq, vm)
  local due = redis.call('ZRANGEBYSCORE', c.delayed, '-inf', dq.now_arg, 'LIMIT', '0', n)
  if #due > 0 then
    local recs = redis.call('HMGET', dq.runs, unpack(due))
    local zargs, min_rs = {}, nil
    for i, id in ipairs(due) do
      -- (a run without its record, evicted under Config.AllowEviction, is
      -- dropped: it leaves the delayed set and is not made ready)
      if recs[i] then
        local r = rec_parse(recs[i])
        -- (a record that does not parse, a hand edit or a writer's bug,
        -- is made ready now: the call that serves it dead-letters it, see
        -- killCorrupt, where every promotion that reached it failed; so is
        -- one whose at gopher-lua, miniredis's Lua, cannot read as a number)
        local at = r.pr and tonumber(r.at)
        local rs = at and at - r.pr * dq.priority_step or dq.now
        if min_rs == nil or rs < min_rs then min_rs = rs end
        zargs[#zargs + 1] = rs
        zargs[#zargs + 1] = id
      end
    end
    -- (the removal first: on a Redis at maxmemory a script is refused
    -- only at its first write that may add memory, and a promotion moves
    -- runs, it does not add them; a dequeue refused for its promotion
    -- would serve nothing, and a full Redis frees memory only by serving)
    redis.call('ZREM', c.delayed, unpack(due))
    if #zargs > 0 then redis.call('ZADD', c.ready, unpack(zargs)) end
    redis.call('HINCRBY', dq.depth, 'd', -#due)
    if #zargs > 0 then
      local ready_n = redis.call('HINCRBY', dq.depth, 'r', #zargs / 2)
      if redis.call('ZADD', dq.ck_index, 'LT', 'CH', min_rs, vm) == 1 then hooks:ready_start(vm) end
      place_widen(dq, 'r', ready_n, #zargs / 2, c.ready)
    end
    dq.dirty = true
  end
  index_head(c.delayed, dq.delay_index, vm)
  return #due
end

-- Runs of vm in flight before this call.
local function dq_inflight(dq, vm)
  local c = dq_var(dq, vm)
  if c.inflight_n == nil then c.inflight_n = tonumber(redis.call('HGET', dq.kin, vm)) or 0 end
  return c.inflight_n
end

-- True when vm's own limit blocks another serve.
local function dq_at_limit(dq, vm)
  if dq.key_limit <= 0 then return false end
  local c = dq_var(dq, vm)
  return dq_inflight(dq, vm) + c.taken - (c.swept or 0) >= dq.key_limit
end

-- dq_promote's second and third passes of a flag-off call
-- (vtime.spreadLeft) over the due variants at the positions filled
-- (those that filled their first share; then again over those not held,
-- with what the held took), plan holding what each took: each takes up to
-- the same share of left, ceil(left / #filled), within the promote limit;
-- those that filled that take what is still left, in order.
local function dq_spread(dq, hooks, due, plan, filled, left)
  if left <= 0 or not filled[1] then return end
  local limit = dq.promote_limit
  local share = math.ceil(left / #filled)
  local again = {}
  for _, i in ipairs(filled) do
    local want = math.min(share, limit - plan[i])
    if want > 0 then
      local got = dq_promote_variant(dq, hooks, due[i], want)
      if got == want then again[#again + 1] = i end
      plan[i] = plan[i] + got
      left = left - got
    end
  end
  for _, i in ipairs(again) do
    if left <= 0 then break end
    local more = math.min(limit - plan[i], left)
    if more > 0 then
      local got = dq_promote_variant(dq, hooks, due[i], more)
      plan[i] = plan[i] + got
      left = left - got
    end
  end
end

-- dq_promote's later passes of a flag-on call (vtime.fillByWeight): total
-- goes to the due variants at the positions among by weighted
-- water-filling, ws their milli-weights. Each can take cap = min(promote
-- limit - plan, its due runs left) more (one ZCOUNT of its due runs the
-- first time it is needed, kept in rest); in increasing order of cap /
-- weight, one whose cap is within its part of what is still to give, cap
-- <= total x weight / the weights' sum over those not yet given, takes
-- its cap, and the others take ceil(total x weight / sum) of what is left
-- then (within their cap). Then each is promoted once, in the order the
-- call reached them: what a variant cannot take goes to the others by
-- weight, none by its place.
local function dq_fill(dq, hooks, due, plan, among, total, ws, rest)
  local limit = dq.promote_limit
  local cand, cap = {}, {}
  for _, i in ipairs(among) do
    local c = limit - plan[i]
    if c > 0 then
      if rest[i] == nil then
        rest[i] = redis.call('ZCOUNT', dq_var(dq, due[i]).delayed, '-inf', dq.now_arg)
      end
      c = math.min(c, rest[i])
    end
    if c > 0 then
      cand[#cand + 1] = i
      cap[i] = c
    end
  end
  table.sort(cand, function(a, b)
    local x, y = cap[a] * ws[b], cap[b] * ws[a]
    if x ~= y then return x < y end
    return a < b
  end)
  local sum = 0
  for _, i in ipairs(cand) do sum = sum + ws[i] end
  local give, k = {}, 1
  while cand[k] and cap[cand[k]] * sum <= total * ws[cand[k]] do
    local i = cand[k]
    give[i] = cap[i]
    total = total - cap[i]
    sum = sum - ws[i]
    k = k + 1
  end
  for j = k, #cand do
    local i = cand[j]
    give[i] = math.ceil(total * ws[i] / sum)
  end
  for _, i in ipairs(among) do
    local g = give[i]
    if g and g > 0 then
      local got = dq_promote_variant(dq, hooks, due[i], g)
      plan[i] = plan[i] + got
      rest[i] = rest[i] - got
    end
  end
end

-- Promote the due delayed runs of the first scan due variants, as many of
-- each as the plan gives (vtime.PromotePlan flag off,
-- vtime.PromotePlanWeighted flag on): the call's budget, max(promote
-- limit, maxCount). First every variant takes up to its share, fixed when
-- the call starts: flag off the same, min(limit, ceil(budget /
-- variants)); flag on by weight, min(limit, ceil(budget x weight / the
-- variants' sum)). Then what they left goes to those that filled their
-- share: flag off by dq_spread (the same share again, then what is still
-- left in order), flag on by dq_fill (weighted water-filling). Then the
-- variants at their key limit (held: the call cannot serve them) keep what
-- they took, and the others take as much again, spread or filled as before
-- over those not held that filled their first share, so that the budget
-- goes whole to the variants the call can serve. So one call promotes
-- fewer than 2 x (budget + scan) runs however many are due, and a share
-- one variant left unused goes to others (flag off, what the second pass
-- leaves by a variant's place in the delay index: due time, then
-- member). A look at delayIndex's head comes first: when nothing is due
-- (the common case) it is all the call reads of delayed runs, and
-- dq_finish reuses it. pick, when given (the flag-on dequeue), chooses the
-- variants when more than scan are due: it gets the first scan + 1 and
-- returns those to promote. weigh, when given (the flag-on dequeue), gets
-- the variants to promote and returns their milli-weights.
local function dq_promote(dq, hooks, pick, weigh)
  local head = redis.call('ZRANGE', dq.delay_index, '0', '0', 'WITHSCORES')
  if not head[2] then
    dq.delay_head = false
    return
  end
  if num(head[2]) > dq.now then
    dq.delay_head = num(head[2])
    return
  end
  local n = dq.scan
  if pick then n = n + 1 end
  local due = redis.call('ZRANGEBYSCORE', dq.delay_index, '-inf', dq.now_arg, 'LIMIT', '0', n)
  if #due > dq.scan then due = pick(due) end
  local limit = dq.promote_limit
  local left = math.max(limit, dq.max_count)
  local share = math.min(limit, math.ceil(left / #due))
  local ws, sum = weigh and weigh(due), 0
  if ws then
    for i = 1, #ws do sum = sum + ws[i] end
  end
  local budget = left
  local filled, plan = {}, {}
  for i, vm in ipairs(due) do
    if ws then share = math.min(limit, math.ceil(budget * ws[i] / sum)) end
    local got = dq_promote_variant(dq, hooks, vm, share)
    if got == share then filled[#filled + 1] = i end
    plan[i] = got
    left = left - got
  end
  local spread, rest = ws and dq_fill or dq_spread, {}
  if left > 0 and filled[1] then spread(dq, hooks, due, plan, filled, left, ws, rest) end
  if dq.key_limit <= 0 then return end
  local more, free = 0, {}
  for _, i in ipairs(filled) do
    if not dq_at_limit(dq, due[i]) then free[#free + 1] = i end
  end
  for i, vm in ipairs(due) do
    if dq_at_limit(dq, vm) then more = more + plan[i] end
  end
  if more > 0 and free[1] then spread(dq, hooks, due, plan, free, more, ws, rest) end
end

-- Head of variant vm's ready ZSET as seen by this call (after the runs it
-- took), walked in memory: the first read takes up to 8 entries, each
-- further read doubles what is held, never past cap + 1 + sweep_room in
-- all (one more than the call can take and sweep, so running out of a
-- short read means the variant is empty).
-- Returns the head's ready score and id, or nil.
local function dq_head(dq, vm)
  local c = dq_var(dq, vm)
  local most = dq.cap + 1 + dq.sweep_room
  if c.list == nil then
    local want = math.min(most, 2)
    c.list = redis.call('ZRANGE', c.ready, '0', num_arg(want - 1), 'WITHSCORES')
    c.complete = #c.list < 2 * want
  end
  local p = 2 * c.taken + 1
  if c.list[p] == nil and not c.complete then
    local have = #c.list / 2
    local want = math.min(have, most - have)
    if want > 0 then
      local more = redis.call('ZRANGE', c.ready, num_arg(have), num_arg(have + want - 1), 'WITHSCORES')
      for _, x in ipairs(more) do c.list[#c.list + 1] = x end
      c.complete = #more < 2 * want
    end
  end
  if c.list[p] == nil then return nil end
  return num(c.list[p + 1]), c.list[p]
end

-- True when the head of vm (dq_head found one) has passed its TTL (its
-- TTL entry, due by now) and the call swept fewer than DQ_TTL_LOOK (vtime's
-- sweepHead): the call sweeps it (dq_take with swept). Each such run is
-- swept where the call meets it, as the TTL sweep would delete it: no
-- serve, not counted for the call's capacity or its key's limit.
local function dq_head_due(dq, vm)
  if dq.nswept >= dq.sweep_room then return false end
  local c = dq_var(dq, vm)
  local at = redis.call('ZSCORE', dq.ttl, dq.run_prefix .. vm .. ':' .. c.list[2 * c.taken + 1])
  return at and num(at) <= dq.now or false
end

-- Serve the head of vm (dq_head found one), or, swept, sweep it (it
-- counts neither for cap nor for vm's limit; dq_finish deletes it);
-- returns the next head's ready score, or nil when vm has no ready run
-- left.
local function dq_take(dq, vm, swept)
  local c = dq_var(dq, vm)
  local p = 2 * c.taken + 1
  local id = c.list[p]
  if c.taken == 0 then dq.touched[#dq.touched + 1] = vm end
  c.taken = c.taken + 1
  local k = #dq.served + 1
  dq.served[k], dq.served_vm[k] = id, vm
  if swept then
    c.swept = (c.swept or 0) + 1
    dq.swept[k] = c.list[p + 1] -- its ready score (see dq_finish's back)
    dq.nswept = dq.nswept + 1
  end
  return (dq_head(dq, vm))
end

-- Persist the serves chosen in memory: take the runs out of their ready
-- sets, move them in flight with a lease and a delivery token (unique in
-- the shard for ever: a counter), fix the indexes, the counts and the
-- master score. Records are returned as stored, unparsed (Go reads them);
-- a served run with a TTL leaves the TTL set (its record keeps the
-- deadline until the next rewrite clears it: see lib/record). A run taken
-- whose TTL passed (never delivered, its deadline at or before the call's
-- time) is expired instead, as the TTL sweep would have (vtime's
-- expireTaken): its record and TTL entry go, it takes no slot, lease or
-- token, and, unless the call swept it (dq_take), its variant is in
-- dq.expired_vms (the flag-on dequeue frees its slot for the scheduler as
-- an ack does).
-- Returns a flat array: acks' results count, the acks' results, then for
-- each run taken, in the order taken: encoded id, variant member, record,
-- delivery token; for one expired: encoded id, variant member, false, 0,
-- or -1 for one swept.
local function dq_finish(dq, acked)
  local out = { #acked }
  for _, a in ipairs(acked) do out[#out + 1] = a end
  if #dq.served == 0 then
    if dq.dirty then master_refresh(dq.ck_index, dq.delay_index, dq.master, dq.qm, dq.delay_head, dq.ck_head) end
    return out
  end
  local ids, vms = dq.served, dq.served_vm
  local recs = redis.call('HMGET', dq.runs, unpack(ids))
  -- skip: the places in dq.served of the runs taken whose TTL passed. The
  -- record decides: a run swept for a TTL entry its record does not have
  -- (a hand edit) goes back to its ready set at its score, neither
  -- delivered nor expired (back: its place -> its record's deadline, or
  -- false), and its entry is mended.
  local skip, back = nil, nil
  for i = 1, #ids do
    local rec = recs[i]
    local ttl = false -- the record's deadline (of the variant taken), if any
    if rec and rec_has_ttl(rec) then
      local r = rec_parse(rec)
      if r.ttl and r.vm == vms[i] then ttl = r.ttl end
    end
    if ttl and ttl + 0 <= dq.now then
      skip = skip or {}
      skip[i] = true
    elseif dq.swept[i] then
      back = back or {}
      back[i] = ttl
    end
  end
  if skip or back then
    -- The live runs in lists of their own; the expired ones counted per
    -- variant (c.expired).
    local lids, lvms, lrecs, gids, gmembers = {}, {}, {}, {}, {}
    skip = skip or {}
    dq.expired_vms = {}
    for i = 1, #ids do
      local vm = vms[i]
      if back and back[i] ~= nil then
        local c = dq.vars[vm]
        c.back = c.back or {}
        c.back[#c.back + 1] = dq.swept[i]
        c.back[#c.back + 1] = ids[i]
        local member = dq.run_prefix .. vm .. ':' .. ids[i]
        if back[i] then
          redis.call('ZADD', dq.ttl, back[i], member)
        else
          redis.call('ZREM', dq.ttl, member)
        end
      elseif skip[i] then
        local c = dq.vars[vm]
        if not dq.swept[i] and not c.released then
          c.released = true
          dq.expired_vms[#dq.expired_vms + 1] = vm
        end
        c.expired = (c.expired or 0) + 1
        gids[#gids + 1] = ids[i]
        gmembers[#gmembers + 1] = dq.run_prefix .. vm .. ':' .. ids[i]
      else
        local k = #lids + 1
        lids[k], lvms[k], lrecs[k] = ids[i], vm, recs[i]
      end
    end
    if not dq.expired_vms[1] then dq.expired_vms = nil end -- (all swept)
    if gids[1] then
      redis.call('HDEL', dq.runs, unpack(gids))
      redis.call('ZREM', dq.ttl, unpack(gmembers))
    end
    ids, vms, recs = lids, lvms, lrecs
  end
  -- The in-flight counts of the touched variants not read yet, in one read;
  -- a call that touched one variant whose count it has not read adds to it
  -- instead (one command, not a read and a write).
  local unread = {}
  for _, vm in ipairs(dq.touched) do
    if dq.vars[vm].inflight_n == nil then unread[#unread + 1] = vm end
  end
  local added = #dq.touched == 1 and #unread == 1
  if not added and #unread > 0 then
    local ns = redis.call('HMGET', dq.kin, unpack(unread))
    for i, vm in ipairs(unread) do dq.vars[vm].inflight_n = tonumber(ns[i]) or 0 end
  end
  -- dq_head read past the last run taken (or found the set ended), so the
  -- new head of each touched variant is known without reading it again.
  local heads, emptied, counts = {}, {}, {}
  local nback = 0
  for _, vm in ipairs(dq.touched) do
    local c = dq.vars[vm]
    redis.call('ZREMRANGEBYRANK', c.ready, '0', num_arg(c.taken - 1))
    local p = 2 * c.taken + 1
    local head = c.list[p] and c.list[p + 1]
    c.idle = c.expired or 0 -- runs taken that are not in flight
    if c.back then
      redis.call('ZADD', c.ready, unpack(c.back))
      for j = 1, #c.back, 2 do
        if not head or num(c.back[j]) < num(head) then head = c.back[j] end
      end
      c.idle = c.idle + #c.back / 2
      nback = nback + #c.back / 2
    end
    if head then
      heads[#heads + 1] = head
      heads[#heads + 1] = vm
    else
      emptied[#emptied + 1] = vm
    end
    -- (a variant whose runs taken all expired keeps its count as it is)
    if not added and c.taken > c.idle then
      counts[#counts + 1] = vm
      counts[#counts + 1] = num_arg(dq_inflight(dq, vm) + c.taken - c.idle)
    end
  end
  for i = 1, #heads, 1000 do
    redis.call('ZADD', dq.ck_index, unpack(heads, i, math.min(i + 999, #heads)))
  end
  for i = 1, #emptied, 1000 do
    redis.call('ZREM', dq.ck_index, unpack(emptied, i, math.min(i + 999, #emptied)))
  end
  -- (the counts after the removals: on a Redis at maxmemory a script is
  -- refused only at its first write that may add memory, and a serve's
  -- first write removes runs from their ready sets, so a full Redis still
  -- hands out runs, whose acks free memory)
  if added then
    local c = dq.vars[unread[1]]
    if c.taken > c.idle then
      redis.call('HINCRBY', dq.kin, unread[1], num_arg(c.taken - c.idle))
    end
  elseif #counts > 0 then
    redis.call('HSET', dq.kin, unpack(counts))
  end
  depth_sub(dq.depth, 'r', #dq.served - nback)

  local n = #ids
  if n == 0 then
    local o = #out
    for i, id in ipairs(dq.served) do
      if not (back and back[i] ~= nil) then
        out[o + 1], out[o + 2], out[o + 3], out[o + 4] = id, dq.served_vm[i], false, dq.swept[i] and -1 or 0
        o = o + 4
      end
    end
    master_refresh(dq.ck_index, dq.delay_index, dq.master, dq.qm, dq.delay_head, dq.ck_head)
    return out
  end
  local token0 = redis.call('INCRBY', dq.tokens, num_arg(n)) - n
  -- The counter never runs behind the clock: a call that finds it below
  -- the time in microseconds (below 2^52 until the year 2112), rounded
  -- down to a multiple of 10,240, moves it there. The time is the later of
  -- the call's (the caller's clock, as it sent the call) and the server's
  -- (TIME): a call that go-redis sent again after the master it first went
  -- to died, to the replica that took over, carries its caller's time from
  -- before the failover, and would deal again the tokens the dead master
  -- dealt after it. A new counter (a new shard, or its key lost with the
  -- data: a restart without persistence) and one behind (a failover to a
  -- replica that had not received the last deliveries) so start above
  -- every token dealt before, at an earlier time, so that a holder of a
  -- delivery from before the loss cannot act on one made after it. While
  -- the shard deals fewer than about 10,176 tokens per 10.24 ms (10,240
  -- less the place kept below), that is one SET per 10.24 ms at most. The
  -- floor is a multiple of 64, as 0 is, and a move keeps the counter's
  -- place among the multiples of 64: the wide checks below fall once per
  -- 64 deliveries however often the counter moves (the cost stays the same
  -- from one counter to the next, and under a clock that runs fast against
  -- the work, as the server's does under a profiler).
  local time = redis.call('TIME')
  local floor = math.min(math.max(dq.now * 1000, time[1] * 1000000 + time[2]), 4503599627370496)
  floor = floor - floor % 10240
  if token0 < floor then
    token0 = floor + token0 % WIDE.AT
    redis.call('SET', dq.tokens, num_arg(token0 + n))
  end
  local env_in = redis.call('INCRBY', dq.env_n, num_arg(n))
  local fields, leases = {}, {}
  for i, id in ipairs(ids) do
    local vm = vms[i]
    fields[2 * i - 1] = vm .. ':' .. id
    fields[2 * i] = num_arg(token0 + i)
    leases[2 * i - 1] = dq.lease_deadline
    leases[2 * i] = dq.run_prefix .. vm .. ':' .. id
  end
  redis.call('HSET', dq.held, unpack(fields))
  redis.call('ZADD', dq.leases, unpack(leases))
  -- Once per 64 tokens of the shard (past a multiple of 64): the wide
  -- marks of the in-flight hashes (lib/held) and the wide sets (lib/place).
  if n >= WIDE.AT or (token0 + n) % WIDE.AT < n then
    held_widen(dq.held, dq.kin, env_in)
    widen({ dq.ck_index, dq.leases }, dq.runs)
  end
  -- The runs in the order taken, the expired ones in their places.
  local expiring = {}
  local o, j = #out, 0
  for i, id in ipairs(dq.served) do
    if back and back[i] ~= nil then
      o = o - 4 -- (back in its ready set: not in the reply)
    elseif skip and skip[i] then
      out[o + 1], out[o + 2], out[o + 3], out[o + 4] = id, dq.served_vm[i], false, dq.swept[i] and -1 or 0
    else
      j = j + 1
      out[o + 1], out[o + 2], out[o + 3], out[o + 4] = id, vms[j], recs[j], token0 + j
      -- (no record: the runs hash was evicted, Config.AllowEviction; the
      -- run goes out without one and the client acks it at once)
      if recs[j] and rec_has_ttl(recs[j]) then expiring[#expiring + 1] = leases[2 * j] end
    end
    o = o + 4
  end
  if #expiring > 0 then redis.call('ZREM', dq.ttl, unpack(expiring)) end
  master_refresh(dq.ck_index, dq.delay_index, dq.master, dq.qm, dq.delay_head, dq.ck_head)
  return out
end
