-- dequeue (scheduler flag off): serve up to maxCount ready runs of one base
-- queue in age order (lowest ready score first across its variants; ties by
-- variant member), each moved in flight with a lease. One variant may give
-- several runs in one call.
--
-- KEYS[1] -> queue ckIndex ZSET (variant member, score head ready score ms)
-- KEYS[2] -> queue delayIndex ZSET (variant member, score earliest available_at ms)
-- KEYS[3] -> queue depth HASH (r, d)
-- KEYS[4] -> shard master ZSET (queue member, score earliest work ms)
-- KEYS[5] -> shard leases ZSET (run member, score lease deadline ms)
-- KEYS[6] -> env inflight SET (run members)
-- KEYS[7] -> queue inflight SET (encoded ids)
-- KEYS[8] -> queue runs HASH (metadata and payload fields)
-- KEYS[9] -> shard ttl ZSET (run member, score expiry deadline ms)
-- KEYS[10+3i..12+3i] -> candidate i's ready ZSET, delayed ZSET, inflight SET
-- ARGV[1] -> now (ms)
-- ARGV[2] -> maxCount
-- ARGV[3] -> env concurrency limit, 0 for none
-- ARGV[4] -> queue concurrency limit (all keys), 0 for none
-- ARGV[5] -> per-key concurrency limit, 0 for none
-- ARGV[6] -> lease deadline (ms)
-- ARGV[7] -> queue member
-- ARGV[8] -> run member prefix (encoded env ":" encoded queue ":")
-- ARGV[9] -> priority step (ms)
-- ARGV[10] -> scan: ckIndex entries read (and due delayed variants promoted)
-- ARGV[11] -> promote limit: runs promoted per variant per call
-- ARGV[12] -> n, the number of candidate variants
-- ARGV[13..12+n] -> candidate variant members, in KEYS order
-- Returns: see dequeue_end.
local FK = 9
local now = tonumber(ARGV[1])
-- Run metadata lives in one HASH field per run: "st|att|dl|ld|vm|pr|at|ttl".
--   st  state: r ready, d delayed, f in flight, x dead
--   att attempt number of the next (or current) delivery, from 1
--   dl  delivery counter: the lease token of the current holder
--   ld  lease deadline (ms), 0 when not in flight
--   vm  variant member ("=" + encoded concurrency key)
--   pr  priority 0..9
--   at  available_at (ms)
--   ttl expiry deadline (ms), 0 for none
local function meta_parse(s)
  local st, att, dl, ld, vm, pr, at, ttl =
    string.match(s, '^(%a)|(%d+)|(%d+)|(%d+)|([^|]*)|(%d)|(-?%d+)|(%d+)$')
  return { st = st, att = tonumber(att), dl = tonumber(dl), ld = tonumber(ld), vm = vm,
           pr = tonumber(pr), at = tonumber(at), ttl = tonumber(ttl) }
end

local function meta_format(m)
  return m.st .. '|' .. string.format('%d', m.att) .. '|' .. string.format('%d', m.dl) .. '|' ..
    string.format('%d', m.ld) .. '|' .. m.vm .. '|' .. string.format('%d', m.pr) .. '|' ..
    string.format('%d', m.at) .. '|' .. string.format('%d', m.ttl)
end
-- Scheduler flag off: variants are served in age order; nothing to track.
local function on_ready_start(vm) end
local function on_ready_empty(vm) end
-- Recompute the queue's score in the shard master ZSET: the earliest time it
-- has work (lowest ready head score, or earliest delayed available_at).
local function master_refresh(ck_index, delay_index, master, qm)
  local r = redis.call('ZRANGE', ck_index, 0, 0, 'WITHSCORES')
  local d = redis.call('ZRANGE', delay_index, 0, 0, 'WITHSCORES')
  local best = nil
  if r[2] then best = tonumber(r[2]) end
  if d[2] then
    local x = tonumber(d[2])
    if best == nil or x < best then best = x end
  end
  if best == nil then
    redis.call('ZREM', master, qm)
  else
    redis.call('ZADD', master, best, qm)
  end
end

-- Take n queued runs off the depth counter field ('r' or 'd'). When the
-- queue then holds no queued run, the counters are deleted, so a queue whose
-- last run is acked, dead-lettered or expired leaves no key behind.
local function depth_sub(depth, field, n)
  if redis.call('HINCRBY', depth, field, -n) > 0 then return end
  local other = 'd'
  if field == 'd' then other = 'r' end
  if (tonumber(redis.call('HGET', depth, other)) or 0) <= 0 then redis.call('DEL', depth) end
end

-- Put a queued run into its variant: ready (scored by ready score) when
-- available_at <= now, else delayed (scored by available_at). Maintains the
-- depth counters, ckIndex / delayIndex (LT keeps the head) and the master
-- score, which can only move when the index entry did (CH says so).
-- on_ready_start(vm) runs when the variant's ready head is new or earlier
-- (the scheduler registers a variant that has no tag).
-- Returns: ready (the run is ready), earliest (the run is now the queue's
-- earliest work).
local function place(q, v, id, vm, at, rs, now)
  if at <= now then
    redis.call('ZADD', v.ready, rs, id)
    redis.call('HINCRBY', q.depth, 'r', 1)
    if redis.call('ZADD', q.ck_index, 'LT', 'CH', rs, vm) == 1 then
      on_ready_start(vm)
      redis.call('ZADD', q.master, 'LT', rs, q.qm)
    end
    return true, false
  end
  redis.call('ZADD', v.delayed, at, id)
  redis.call('HINCRBY', q.depth, 'd', 1)
  local earliest = false
  if redis.call('ZADD', q.delay_index, 'LT', 'CH', at, vm) == 1 then
    earliest = redis.call('ZADD', q.master, 'LT', 'CH', at, q.qm) == 1
  end
  return false, earliest
end

-- place, then wake the consumers blocked on channel wake ('' for none) when
-- the run is ready, or when it is delayed and now the queue's earliest work:
-- they then sleep until its time instead of until their timeout.
local function place_wake(q, v, id, vm, at, rs, now, wake)
  local ready, earliest = place(q, v, id, vm, at, rs, now)
  if wake ~= '' and (ready or earliest) then redis.call('PUBLISH', wake, q.qm) end
  return ready
end

-- Point vm's entry in index (ckIndex or delayIndex) at the head score of
-- its set, or remove the entry when the set is empty. Returns false then.
local function index_head(set, index, vm)
  local head = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
  if head[2] then
    redis.call('ZADD', index, head[2], vm)
    return true
  end
  redis.call('ZREM', index, vm)
  return false
end

-- Remove a queued run from its variant (ready or delayed) and fix the
-- indexes. on_ready_empty(vm) runs when the variant's last ready run leaves.
local function unplace(q, v, id, vm, st)
  if st == 'r' then
    if redis.call('ZREM', v.ready, id) == 0 then return false end
    depth_sub(q.depth, 'r', 1)
    if not index_head(v.ready, q.ck_index, vm) then on_ready_empty(vm) end
  else
    if redis.call('ZREM', v.delayed, id) == 0 then return false end
    depth_sub(q.depth, 'd', 1)
    index_head(v.delayed, q.delay_index, vm)
  end
  master_refresh(q.ck_index, q.delay_index, q.master, q.qm)
  return true
end
-- Shared start of the dequeue scripts: bind keys and arguments, compute the
-- capacity the env and queue limits allow, map the candidate variants Go
-- read ahead (only those have declared keys), and promote due delayed runs.
local q = { ck_index = KEYS[1], delay_index = KEYS[2], depth = KEYS[3], master = KEYS[4],
            meta = KEYS[8], qm = ARGV[7] }
local leases, env_inflight, queue_inflight, ttl_set = KEYS[5], KEYS[6], KEYS[7], KEYS[9]
local max_count = tonumber(ARGV[2])
local env_limit = tonumber(ARGV[3])
local queue_limit = tonumber(ARGV[4])
local key_limit = tonumber(ARGV[5])
local lease_deadline = tonumber(ARGV[6])
local run_prefix = ARGV[8]
local priority_step = tonumber(ARGV[9])
local scan = tonumber(ARGV[10])
local promote_limit = tonumber(ARGV[11])
local ncand = tonumber(ARGV[12])

local cap = max_count
if env_limit > 0 then cap = math.min(cap, env_limit - redis.call('SCARD', env_inflight)) end
if queue_limit > 0 then cap = math.min(cap, queue_limit - redis.call('SCARD', queue_inflight)) end
if cap <= 0 then return {} end

-- cands[vm] = { ready, delayed, inflight keys; inflight count; prefetched ready head }
local cands = {}
for i = 1, ncand do
  local base = FK + 3 * (i - 1)
  cands[ARGV[12 + i]] = { ready = KEYS[base + 1], delayed = KEYS[base + 2], inflight = KEYS[base + 3] }
end
local touched = {}   -- variant members in first-serve order
local dirty = false  -- promotion or serve wrote something

-- Move up to promote_limit due runs of variant vm from delayed to ready.
local function promote(vm)
  local c = cands[vm]
  if c == nil then return end
  local due = redis.call('ZRANGEBYSCORE', c.delayed, '-inf', now, 'WITHSCORES', 'LIMIT', 0, promote_limit)
  if #due > 0 then
    local ids = {}
    for i = 1, #due, 2 do ids[#ids + 1] = due[i] end
    local metas = redis.call('HMGET', q.meta, unpack(ids))
    local zargs, hargs, min_rs = {}, {}, nil
    for i, id in ipairs(ids) do
      local m = meta_parse(metas[i])
      local rs = m.at - m.pr * priority_step
      if min_rs == nil or rs < min_rs then min_rs = rs end
      zargs[#zargs + 1] = rs
      zargs[#zargs + 1] = id
      m.st = 'r'
      hargs[#hargs + 1] = id
      hargs[#hargs + 1] = meta_format(m)
    end
    redis.call('ZADD', c.ready, unpack(zargs))
    redis.call('ZREM', c.delayed, unpack(ids))
    redis.call('HSET', q.meta, unpack(hargs))
    redis.call('HINCRBY', q.depth, 'd', -#ids)
    redis.call('HINCRBY', q.depth, 'r', #ids)
    if redis.call('ZADD', q.ck_index, 'LT', min_rs, vm) == 1 then on_ready_start(vm) end
    dirty = true
  end
  index_head(c.delayed, q.delay_index, vm)
end

local due_variants = redis.call('ZRANGEBYSCORE', q.delay_index, '-inf', now, 'LIMIT', 0, scan)
for _, vm in ipairs(due_variants) do promote(vm) end

-- Head of variant vm's ready ZSET as seen by this call, walked in memory:
-- the first read takes up to 8 entries, each further read doubles what is
-- held, never past cap + 1 in all (one more than the call can take, so
-- running out of a short read means the variant is empty). taken counts
-- the runs served.
local function head(vm)
  local c = cands[vm]
  if c.list == nil then
    local want = math.min(cap + 1, 8)
    c.list = redis.call('ZRANGE', c.ready, 0, want - 1, 'WITHSCORES')
    c.taken = 0
    c.complete = #c.list < 2 * want
  end
  local p = 2 * c.taken + 1
  if c.list[p] == nil and not c.complete then
    local have = #c.list / 2
    local want = math.min(have, cap + 1 - have)
    if want > 0 then
      local more = redis.call('ZRANGE', c.ready, have, have + want - 1, 'WITHSCORES')
      for _, x in ipairs(more) do c.list[#c.list + 1] = x end
      c.complete = #more < 2 * want
    end
  end
  if c.list[p] == nil then return nil end
  return tonumber(c.list[p + 1]), c.list[p]
end

-- True when vm's own limit blocks another serve.
local function key_gated(vm)
  if key_limit <= 0 then return false end
  local c = cands[vm]
  if c.inflight_n == nil then c.inflight_n = redis.call('SCARD', c.inflight) end
  return c.inflight_n + (c.taken or 0) >= key_limit
end

-- Serve the head of vm; returns its ready score and the next head's.
local served = {}
local function take(vm)
  local c = cands[vm]
  local p = 2 * c.taken + 1
  local rs, id = tonumber(c.list[p + 1]), c.list[p]
  if c.taken == 0 then touched[#touched + 1] = vm end
  c.taken = c.taken + 1
  served[#served + 1] = { vm = vm, id = id }
  return rs, (head(vm))
end
-- A window is the part of a sorted set a dequeue read: its first n entries
-- ({vm, s} in ZSET order: score, then member), kept sorted in memory as
-- scores change. An entry whose new score sorts after the n-th entry read
-- leaves the window, because unread entries may sort before it; a set read
-- whole (raw holds at most n entries) has no such bound. raw is a ZRANGE
-- WITHSCORES reply of up to n + spare + 1 entries; extra holds more {vm, s}
-- entries to merge in (variants registered by this call). Up to spare
-- entries after the first n are kept aside to refill the window when one
-- of its entries turns out to be stale (window_drop).
local function entry_before(a, b) return a.s < b.s or (a.s == b.s and a.vm < b.vm) end

local function window_new(raw, n, extra, spare)
  local list = {}
  for i = 1, #raw, 2 do list[#list + 1] = { vm = raw[i], s = tonumber(raw[i + 1]) } end
  if extra then
    for _, e in ipairs(extra) do list[#list + 1] = { vm = e.vm, s = e.s } end
    table.sort(list, entry_before)
  end
  local w = { list = list, bound = nil, spare = {} }
  if #list > n then
    spare = spare or 0
    for i = n + 1, math.min(#list, n + spare) do w.spare[#w.spare + 1] = list[i] end
    w.more = #list > n + spare
    for i = #list, n + 1, -1 do list[i] = nil end
    w.bound = { vm = list[n].vm, s = list[n].s }
  end
  return w
end

-- First member of the window for which ok(vm) holds, or nil.
local function window_first(w, ok)
  local list = w.list
  for i = 1, #list do
    local vm = list[i].vm
    if ok(vm) then return vm end
  end
  return nil
end

-- Remove vm; returns its entry, or nil when it was not in the window.
local function window_remove(w, vm)
  local list = w.list
  for i = 1, #list do
    local e = list[i]
    if e.vm == vm then
      table.remove(list, i)
      return e
    end
  end
  return nil
end

-- Drop vm from the window for good and take the next spare entry in its
-- place (every spare entry sorts after the window's, so it goes last).
local function window_drop(w, vm)
  if not window_remove(w, vm) then return end
  local nxt = table.remove(w.spare, 1)
  if nxt == nil then return end
  w.list[#w.list + 1] = nxt
  if #w.spare == 0 and not w.more then
    w.bound = nil
  else
    w.bound = { vm = nxt.vm, s = nxt.s }
  end
end

-- Re-sort vm with its new score s, if it is in the window.
local function window_move(w, vm, s)
  local e = window_remove(w, vm)
  if e == nil then return end
  e.s = s
  if w.bound ~= nil and entry_before(w.bound, e) then return end
  local list = w.list
  local at = #list + 1
  for i = 1, #list do
    if entry_before(e, list[i]) then
      at = i
      break
    end
  end
  table.insert(list, at, e)
end

-- Age order: the first scan entries of ckIndex (lowest head ready score,
-- then member); each serve takes the first servable one.
-- Without a per-key limit every variant in ckIndex is servable and each
-- serve moves one variant back, so the call can only serve among the first
-- cap: reading further (a costly WITHSCORES reply) would change nothing.
local reach = scan
if key_limit <= 0 then reach = math.min(scan, cap) end
local age = window_new(redis.call('ZRANGE', q.ck_index, 0, reach, 'WITHSCORES'), reach)
local function servable(vm)
  return cands[vm] ~= nil and not key_gated(vm) and head(vm) ~= nil
end
while #served < cap do
  local vm = window_first(age, servable)
  if vm == nil then break end
  local _, nxt = take(vm)
  if nxt == nil then
    window_remove(age, vm)
  else
    window_move(age, vm, nxt)
  end
end
-- Shared end of the dequeue scripts: persist the serves chosen in memory,
-- move the runs in flight with a lease, and return them.
-- Returns a flat array: for each run, encoded id, variant member, payload,
-- attempt, delivery token.
if #served == 0 then
  if dirty then master_refresh(q.ck_index, q.delay_index, q.master, q.qm) end
  return {}
end
-- head() read past the last run taken (or found the set ended), so the
-- new head of each touched variant is known without reading it again.
local heads, emptied = {}, {}
for _, vm in ipairs(touched) do
  local c = cands[vm]
  local ids = {}
  for i = 1, c.taken do ids[i] = c.list[2 * i - 1] end
  redis.call('ZREMRANGEBYRANK', c.ready, 0, c.taken - 1)
  redis.call('SADD', c.inflight, unpack(ids))
  local p = 2 * c.taken + 1
  if c.list[p] then
    heads[#heads + 1] = c.list[p + 1]
    heads[#heads + 1] = vm
  else
    emptied[#emptied + 1] = vm
  end
end
if #heads > 0 then redis.call('ZADD', q.ck_index, unpack(heads)) end
if #emptied > 0 then redis.call('ZREM', q.ck_index, unpack(emptied)) end
depth_sub(q.depth, 'r', #served)

local ids, fields, members, lease_args = {}, {}, {}, {}
for i, s in ipairs(served) do
  ids[i] = s.id
  fields[2 * i - 1] = s.id
  fields[2 * i] = s.id .. ':p'
  members[i] = run_prefix .. s.vm .. ':' .. s.id
  lease_args[2 * i - 1] = lease_deadline
  lease_args[2 * i] = members[i]
end
-- Metadata and payload of every served run in one read.
local got = redis.call('HMGET', q.meta, unpack(fields))
local hargs, out, expiring = {}, {}, {}
for i, s in ipairs(served) do
  local m = meta_parse(got[2 * i - 1])
  m.st, m.dl, m.ld = 'f', m.dl + 1, lease_deadline
  if m.ttl > 0 then expiring[#expiring + 1] = members[i] end
  hargs[#hargs + 1] = s.id
  hargs[#hargs + 1] = meta_format(m)
  out[#out + 1] = s.id
  out[#out + 1] = s.vm
  out[#out + 1] = got[2 * i]
  out[#out + 1] = m.att
  out[#out + 1] = m.dl
end
redis.call('HSET', q.meta, unpack(hargs))
redis.call('SADD', env_inflight, unpack(members))
redis.call('SADD', queue_inflight, unpack(ids))
redis.call('ZADD', leases, unpack(lease_args))
if #expiring > 0 then redis.call('ZREM', ttl_set, unpack(expiring)) end
master_refresh(q.ck_index, q.delay_index, q.master, q.qm)
return out
