-- dequeue_vtime (scheduler flag on): serve up to maxCount ready runs of one
-- base queue in fair virtual-time order across its variants (start-time fair
-- queuing; vtime/ is the model this must match step by step), each moved in
-- flight with a lease. Every serve re-decides, so a variant may be served
-- several times in one call and a call of N serves what N calls of 1 would.
--
-- KEYS[1..9] -> as dequeue.lua
-- KEYS[10] -> queue ckVtime ZSET (variant member, score tag S)
-- KEYS[11] -> queue ckVtimeFloor STRING (see hooks_vtime)
-- KEYS[12] -> queue ckVtimeIdle ZSET (variant member, score parked tag)
-- KEYS[13] -> queue weights HASH (variant member -> weight)
-- KEYS[14+3i..16+3i] -> candidate i's ready ZSET, delayed ZSET, inflight SET
-- ARGV[1..12+n] -> as dequeue.lua (ARGV[10], scan: the age-order window,
--                   the discovery window and the due variants promoted)
-- ARGV[13+n] -> quantum
-- ARGV[14+n] -> state TTL (s)
-- ARGV[15+n] -> idle set cap
-- ARGV[16+n] -> window multiplier
-- ARGV[17+n] -> 1 when ckIndex has variants without a tag (discovery), else 0
-- Returns: see dequeue_end.
local NK, FK = 9, 13
local now = tonumber(ARGV[1])
local NA = 12 + tonumber(ARGV[12])
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
-- Scheduler flag on: keep each variant's virtual start tag (see vtime/doc.go,
-- the model these functions implement).
-- KEYS[NK+1] -> queue ckVtime ZSET (variant member, score tag S)
-- KEYS[NK+2] -> queue ckVtimeFloor STRING "V|L|c|nw": clock V, last
--               newcomer tag L ("" for none), discovery cursor c, weight
--               overrides nw (-1 unknown)
-- KEYS[NK+3] -> queue ckVtimeIdle ZSET (variant member, score parked tag)
-- KEYS[NK+4] -> queue weights HASH (variant member -> weight)
-- ARGV[NA+1] -> quantum
-- ARGV[NA+2] -> state TTL (s)
-- ARGV[NA+3] -> idle set cap
local vt = { tags = KEYS[NK + 1], floor = KEYS[NK + 2], idle = KEYS[NK + 3], weights = KEYS[NK + 4],
             quantum = tonumber(ARGV[NA + 1]), ttl = tonumber(ARGV[NA + 2]), idle_max = tonumber(ARGV[NA + 3]) }

-- Tags travel as strings with 17 significant digits: exact doubles on Redis
-- and on gopher-lua alike.
local function fmt(x) return string.format('%.17g', x) end

local function floor_read()
  local raw = redis.call('GET', vt.floor)
  if not raw then return { v = 0, l = nil, c = 0, nw = -1 } end
  local v, l, c, nw = string.match(raw, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
  return { v = tonumber(v), l = tonumber(l), c = tonumber(c), nw = tonumber(nw) }
end

-- Persist the floor, and refresh the TTL of ckVtime, which every caller
-- has just written (it may have been recreated after draining empty).
local function floor_write(f)
  redis.call('EXPIRE', vt.tags, vt.ttl)
  local l = ''
  if f.l ~= nil then l = fmt(f.l) end
  redis.call('SET', vt.floor, fmt(f.v) .. '|' .. l .. '|' .. string.format('%d', f.c) .. '|' ..
    string.format('%d', f.nw), 'EX', vt.ttl)
end

-- A variant gained its first ready run: register it. Returning variants get
-- max(V, parked); newcomers queue one quantum behind the highest of {the
-- highest tag capped at V + quantum, the previous newcomer's tag}, or at V
-- when that is not above V.
local function register_new(vm)
  if redis.call('ZSCORE', vt.tags, vm) then return end
  local f = floor_read()
  local s
  local parked = redis.call('ZSCORE', vt.idle, vm)
  if parked then
    s = math.max(f.v, tonumber(parked))
    redis.call('ZREM', vt.idle, vm)
  else
    local a = nil
    local top = redis.call('ZRANGE', vt.tags, -1, -1, 'WITHSCORES')
    if top[2] then a = math.min(tonumber(top[2]), f.v + vt.quantum) end
    if f.l ~= nil and (a == nil or f.l > a) then a = f.l end
    s = f.v
    if a ~= nil and a > f.v then s = a + vt.quantum end
    f.l = s
  end
  redis.call('ZADD', vt.tags, fmt(s), vm)
  floor_write(f)
end

local function on_ready_start(vm) register_new(vm) end

-- Drop parked tags at or below V (they confer nothing) and all but the
-- highest idle_max: run by every call that parks one.
local function reap_idle(v)
  redis.call('ZREMRANGEBYSCORE', vt.idle, '-inf', fmt(v))
  redis.call('ZREMRANGEBYRANK', vt.idle, 0, -(vt.idle_max + 1))
  redis.call('EXPIRE', vt.idle, vt.ttl)
end

-- A variant's last ready run left outside a dequeue: park its tag when it
-- is above V (it owes service), and leave the fair order.
local function on_ready_empty(vm)
  local s = redis.call('ZSCORE', vt.tags, vm)
  if not s then return end
  redis.call('ZREM', vt.tags, vm)
  local v = floor_read().v
  if tonumber(s) > v then
    redis.call('ZADD', vt.idle, s, vm)
    reap_idle(v)
  end
end
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
local wc = max_count * tonumber(ARGV[NA + 4])
local repair = ARGV[NA + 5] == '1'

-- Due delayed runs were promoted (and their variants registered) above.
local f = floor_read()
local V = f.v
local tags = {}      -- variant -> working tag, for the variants this call saw
local changed = {}   -- variants whose tag this call sets
local idle_taken = {}
-- Without a per-key limit and with nothing to repair every variant in the
-- windows is servable and each serve moves one variant back, so the call
-- can only serve among the first cap of each window: reading further (a
-- costly WITHSCORES reply) would change nothing. (Go passes keys on the
-- same rule.)
local reach, reach1 = scan, 2 * wc
if key_limit <= 0 and not repair then reach, reach1 = math.min(scan, cap), math.min(2 * wc, cap) end
local age_raw = redis.call('ZRANGE', q.ck_index, 0, reach, 'WITHSCORES')

-- Discovery: variants with ready runs but no tag register at max(V, parked)
-- or V, from the oldest scan and from scan more at the rotating cursor.
local discovered = {}
if repair then
  local index_n = redis.call('ZCARD', q.ck_index)
  local seen, list = {}, {}
  local function consider(vm)
    if not seen[vm] then
      seen[vm] = true
      list[#list + 1] = vm
    end
  end
  for i = 1, math.min(#age_raw, 2 * scan), 2 do consider(age_raw[i]) end
  if f.c < index_n then
    for _, vm in ipairs(redis.call('ZRANGE', q.ck_index, f.c, f.c + scan - 1)) do consider(vm) end
  end
  if #list > 0 then
    local have = redis.call('ZMSCORE', vt.tags, unpack(list))
    local need = {}
    for i, vm in ipairs(list) do
      if not have[i] then need[#need + 1] = vm end
    end
    if #need > 0 then
      local parked = redis.call('ZMSCORE', vt.idle, unpack(need))
      for i, vm in ipairs(need) do
        local s = V
        if parked[i] then
          s = math.max(V, tonumber(parked[i]))
          idle_taken[#idle_taken + 1] = vm
        end
        discovered[#discovered + 1] = { vm = vm, s = s }
        tags[vm] = s
        changed[vm] = true
      end
    end
  end
  f.c = f.c + scan
  if f.c >= index_n then f.c = 0 end
end

-- Pass 1 reads 2*wc tags and, when the counts differ (repair), 2*wc more
-- to replace stale ones: tags of variants with no ready run, which only a
-- flag-off instance leaves behind (it drains variants without touching
-- ckVtime), and which make the counts differ.
local spare = 0
if repair then spare = 2 * wc end
local scan_raw = redis.call('ZRANGE', vt.tags, 0, reach1 + spare, 'WITHSCORES')
for i = 1, #scan_raw, 2 do tags[scan_raw[i]] = tonumber(scan_raw[i + 1]) end
local pass1 = window_new(scan_raw, reach1, discovered, spare)
local age = window_new(age_raw, reach)

local nw = f.nw
if nw < 0 then
  nw = redis.call('HLEN', vt.weights)
  f.nw = nw
end
local weight_of = {}
local function weight(vm)
  if nw == 0 then return 1 end
  if weight_of[vm] == nil then weight_of[vm] = tonumber(redis.call('HGET', vt.weights, vm)) or 1 end
  return weight_of[vm]
end

local function tag(vm)
  if tags[vm] == nil then
    local s = redis.call('ZSCORE', vt.tags, vm)
    if s then tags[vm] = tonumber(s) else tags[vm] = V end
  end
  return tags[vm]
end

local function servable(vm)
  return cands[vm] ~= nil and not key_gated(vm) and head(vm) ~= nil
end

-- First servable variant of pass 1; stale ones met on the way leave the
-- window for good and are collected below.
local stale = {}
local function pass1_first()
  local i = 1
  while i <= #pass1.list do
    local vm = pass1.list[i].vm
    if servable(vm) then return vm end
    local c = cands[vm]
    if c ~= nil and c.list ~= nil and #c.list == 0 and c.complete then
      stale[#stale + 1] = vm
      window_drop(pass1, vm)
    else
      i = i + 1
    end
  end
  return nil
end

local parked, drained = {}, {}
while #served < cap do
  local vm = pass1_first() or window_first(age, servable)
  if vm == nil then break end
  local e = math.max(tag(vm), V)
  V = math.max(V, e)
  local s = e + vt.quantum / weight(vm)
  tags[vm] = s
  changed[vm] = true
  local _, nxt = take(vm)
  if nxt ~= nil then
    window_move(pass1, vm, s)
    window_move(age, vm, nxt)
  else
    window_remove(pass1, vm)
    window_remove(age, vm)
    if s > V then parked[#parked + 1] = { vm = vm, s = s } end
    drained[#drained + 1] = vm
    changed[vm] = nil
  end
end

-- Stale tags go as drained variants do (parked when above V). This is the
-- one write a call that serves nothing may make: it collects garbage.
for _, vm in ipairs(stale) do
  if tags[vm] > V then parked[#parked + 1] = { vm = vm, s = tags[vm] } end
  drained[#drained + 1] = vm
  changed[vm] = nil
end
if #served > 0 or #stale > 0 then
  local zargs = {}
  for vm, _ in pairs(changed) do
    zargs[#zargs + 1] = fmt(tags[vm])
    zargs[#zargs + 1] = vm
  end
  for i = 1, #zargs, 1000 do
    redis.call('ZADD', vt.tags, unpack(zargs, i, math.min(i + 999, #zargs)))
  end
  if #drained > 0 then redis.call('ZREM', vt.tags, unpack(drained)) end
  if #idle_taken > 0 then redis.call('ZREM', vt.idle, unpack(idle_taken)) end
  if #parked > 0 then
    local iargs = {}
    for _, p in ipairs(parked) do
      iargs[#iargs + 1] = fmt(p.s)
      iargs[#iargs + 1] = p.vm
    end
    redis.call('ZADD', vt.idle, unpack(iargs))
    reap_idle(V)
  end
  f.v = V
  floor_write(f)
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
