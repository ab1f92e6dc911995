-- dequeue (scheduler flag off): serve up to maxCount ready runs of one base
-- queue in age order (lowest ready score first across its variants; ties by
-- variant member), each moved in flight with a lease. One variant may give
-- several runs in one call. Variant keys are derived from their members in
-- the queue's hash slot (see lib/dequeue).
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
-- KEYS[10] -> shard delivery token counter STRING
-- ARGV[1] -> now (ms)
-- ARGV[2] -> maxCount (at most 2000)
-- ARGV[3] -> env concurrency limit, 0 for none
-- ARGV[4] -> queue concurrency limit (all keys), 0 for none
-- ARGV[5] -> per-key concurrency limit, 0 for none
-- ARGV[6] -> lease deadline (ms)
-- ARGV[7] -> queue member
-- ARGV[8] -> run member prefix (encoded env ":" encoded queue ":")
-- ARGV[9] -> priority step (ms)
-- ARGV[10] -> scan: ckIndex entries read (and due delayed variants promoted)
-- ARGV[11] -> promote limit: runs promoted per variant per call
-- ARGV[12] -> variant key base (the queue's keys' start .. ":v:")
-- Returns: see dq_finish.
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

-- A number Redis returned as a string (a score). Real Redis prints scores
-- so that tonumber reads them; miniredis prints some as "1e+8", which
-- gopher-lua's tonumber refuses.
local function num(s)
  local n = tonumber(s)
  if n == nil and s then
    n = tonumber((string.gsub(string.gsub(s, 'e%+', 'e'), '^(-?%d+)e', '%1.0e')))
  end
  return n
end
-- Scheduler flag off: no scheduler state; the hooks do nothing. (The
-- flag-on build includes hooks_vtime instead, with the same function.)
local function hooks_open(keys, args, own_keys, own_args, now)
  local nop = function() end
  return { ready_start = nop, ready_empty = nop, released = nop, finish = nop }
end
-- Recompute the queue's score in the shard master ZSET: the earliest time it
-- has work (lowest ready head score, or earliest delayed available_at).
local function master_refresh(ck_index, delay_index, master, qm)
  local r = redis.call('ZRANGE', ck_index, 0, 0, 'WITHSCORES')
  local d = redis.call('ZRANGE', delay_index, 0, 0, 'WITHSCORES')
  local best = nil
  if r[2] then best = num(r[2]) end
  if d[2] then
    local x = num(d[2])
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
-- hooks.ready_start(vm) runs when the variant's ready head is new or
-- earlier (the scheduler registers a variant that has no tag).
-- Returns: ready (the run is ready), earliest (the run is now the queue's
-- earliest work).
local function place(q, v, hooks, id, vm, at, rs, now)
  if at <= now then
    redis.call('ZADD', v.ready, rs, id)
    redis.call('HINCRBY', q.depth, 'r', 1)
    if redis.call('ZADD', q.ck_index, 'LT', 'CH', rs, vm) == 1 then
      hooks.ready_start(vm)
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
local function place_wake(q, v, hooks, id, vm, at, rs, now, wake)
  local ready, earliest = place(q, v, hooks, id, vm, at, rs, now)
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
-- indexes. hooks.ready_empty(vm) runs when the variant's last ready run
-- leaves.
local function unplace(q, v, hooks, id, vm, st)
  if st == 'r' then
    if redis.call('ZREM', v.ready, id) == 0 then return false end
    depth_sub(q.depth, 'r', 1)
    if not index_head(v.ready, q.ck_index, vm) then hooks.ready_empty(vm) end
  else
    if redis.call('ZREM', v.delayed, id) == 0 then return false end
    depth_sub(q.depth, 'd', 1)
    index_head(v.delayed, q.delay_index, vm)
  end
  master_refresh(q.ck_index, q.delay_index, q.master, q.qm)
  return true
end
-- The machinery both dequeue scripts share, as functions over one call's
-- state dq: binding its keys and arguments, the capacity the env and queue
-- limits leave, promotion of due delayed runs, reading variants' heads,
-- taking runs, and moving the taken runs in flight (dq_finish).
--
-- Variant keys are derived from the variant member ("=" .. encoded key):
-- vbase .. encoded key .. ":ready" (":delayed", ":inflight"), the names
-- keys.Queue.Variant builds in Go. They share the queue's hash tag, so on
-- Redis Cluster they live in the slot of the declared keys.
local function dq_open(keys, args)
  local dq = {
    ck_index = keys[1], delay_index = keys[2], depth = keys[3], master = keys[4], leases = keys[5],
    env_inflight = keys[6], queue_inflight = keys[7], meta = keys[8], ttl_set = keys[9], tokens = keys[10],
    now = tonumber(args[1]), max_count = tonumber(args[2]), env_limit = tonumber(args[3]),
    queue_limit = tonumber(args[4]), key_limit = tonumber(args[5]), lease_deadline = tonumber(args[6]),
    qm = args[7], run_prefix = args[8], priority_step = tonumber(args[9]), scan = tonumber(args[10]),
    promote_limit = tonumber(args[11]), vbase = args[12],
    vars = {},     -- variant member -> { ready, delayed, inflight keys; head cache }
    touched = {},  -- variant members in first-serve order
    served = {},   -- { vm, id } in serve order
    dirty = false, -- promotion wrote something
  }
  local cap = dq.max_count
  if dq.env_limit > 0 then cap = math.min(cap, dq.env_limit - redis.call('SCARD', dq.env_inflight)) end
  if dq.queue_limit > 0 then cap = math.min(cap, dq.queue_limit - redis.call('SCARD', dq.queue_inflight)) end
  dq.cap = cap
  return dq
end

local function dq_var(dq, vm)
  local c = dq.vars[vm]
  if c == nil then
    local b = dq.vbase .. string.sub(vm, 2)
    c = { ready = b .. ':ready', delayed = b .. ':delayed', inflight = b .. ':inflight', taken = 0 }
    dq.vars[vm] = c
  end
  return c
end

-- Move up to promote_limit due runs of variant vm from delayed to ready.
local function dq_promote_variant(dq, hooks, vm)
  local c = dq_var(dq, vm)
  local due = redis.call('ZRANGEBYSCORE', c.delayed, '-inf', dq.now, 'WITHSCORES', 'LIMIT', 0, dq.promote_limit)
  if #due > 0 then
    local ids = {}
    for i = 1, #due, 2 do ids[#ids + 1] = due[i] end
    local metas = redis.call('HMGET', dq.meta, unpack(ids))
    local zargs, hargs, min_rs = {}, {}, nil
    for i, id in ipairs(ids) do
      local m = meta_parse(metas[i])
      local rs = m.at - m.pr * dq.priority_step
      if min_rs == nil or rs < min_rs then min_rs = rs end
      zargs[#zargs + 1] = rs
      zargs[#zargs + 1] = id
      m.st = 'r'
      hargs[#hargs + 1] = id
      hargs[#hargs + 1] = meta_format(m)
    end
    redis.call('ZADD', c.ready, unpack(zargs))
    redis.call('ZREM', c.delayed, unpack(ids))
    redis.call('HSET', dq.meta, unpack(hargs))
    redis.call('HINCRBY', dq.depth, 'd', -#ids)
    redis.call('HINCRBY', dq.depth, 'r', #ids)
    if redis.call('ZADD', dq.ck_index, 'LT', 'CH', min_rs, vm) == 1 then hooks.ready_start(vm) end
    dq.dirty = true
  end
  index_head(c.delayed, dq.delay_index, vm)
end

-- Promote the due delayed runs of the first scan due variants.
local function dq_promote(dq, hooks)
  local due = redis.call('ZRANGEBYSCORE', dq.delay_index, '-inf', dq.now, 'LIMIT', 0, dq.scan)
  for _, vm in ipairs(due) do dq_promote_variant(dq, hooks, vm) end
end

-- Head of variant vm's ready ZSET as seen by this call (after the runs it
-- took), walked in memory: the first read takes up to 8 entries, each
-- further read doubles what is held, never past cap + 1 in all (one more
-- than the call can take, so running out of a short read means the variant
-- is empty). Returns the head's ready score and id, or nil.
local function dq_head(dq, vm)
  local c = dq_var(dq, vm)
  if c.list == nil then
    local want = math.min(dq.cap + 1, 8)
    c.list = redis.call('ZRANGE', c.ready, 0, want - 1, 'WITHSCORES')
    c.complete = #c.list < 2 * want
  end
  local p = 2 * c.taken + 1
  if c.list[p] == nil and not c.complete then
    local have = #c.list / 2
    local want = math.min(have, dq.cap + 1 - have)
    if want > 0 then
      local more = redis.call('ZRANGE', c.ready, have, have + want - 1, 'WITHSCORES')
      for _, x in ipairs(more) do c.list[#c.list + 1] = x end
      c.complete = #more < 2 * want
    end
  end
  if c.list[p] == nil then return nil end
  return num(c.list[p + 1]), c.list[p]
end

-- True when vm's own limit blocks another serve.
local function dq_at_limit(dq, vm)
  if dq.key_limit <= 0 then return false end
  local c = dq_var(dq, vm)
  if c.inflight_n == nil then c.inflight_n = redis.call('SCARD', c.inflight) end
  return c.inflight_n + c.taken >= dq.key_limit
end

-- Serve the head of vm (dq_head found one); returns the next head's ready
-- score, or nil when vm has no ready run left.
local function dq_take(dq, vm)
  local c = dq_var(dq, vm)
  local id = c.list[2 * c.taken + 1]
  if c.taken == 0 then dq.touched[#dq.touched + 1] = vm end
  c.taken = c.taken + 1
  dq.served[#dq.served + 1] = { vm = vm, id = id }
  return (dq_head(dq, vm))
end

-- Persist the serves chosen in memory: take the runs out of their ready
-- sets, move them in flight with a lease and a delivery token (unique in
-- the shard for ever: a counter), fix the indexes and the master score.
-- Returns a flat array: for each run, encoded id, variant member, payload,
-- attempt, delivery token.
local function dq_finish(dq)
  if #dq.served == 0 then
    if dq.dirty then master_refresh(dq.ck_index, dq.delay_index, dq.master, dq.qm) end
    return {}
  end
  -- dq_head read past the last run taken (or found the set ended), so the
  -- new head of each touched variant is known without reading it again.
  local heads, emptied = {}, {}
  for _, vm in ipairs(dq.touched) do
    local c = dq.vars[vm]
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
  for i = 1, #heads, 1000 do
    redis.call('ZADD', dq.ck_index, unpack(heads, i, math.min(i + 999, #heads)))
  end
  for i = 1, #emptied, 1000 do
    redis.call('ZREM', dq.ck_index, unpack(emptied, i, math.min(i + 999, #emptied)))
  end
  depth_sub(dq.depth, 'r', #dq.served)

  local n = #dq.served
  local token0 = redis.call('INCRBY', dq.tokens, n) - n
  local fields, hargs, out, expiring = {}, {}, {}, {}
  local ids, members, lease_args = {}, {}, {}
  for i, s in ipairs(dq.served) do
    fields[2 * i - 1] = s.id
    fields[2 * i] = s.id .. ':p'
  end
  -- Metadata and payload of every served run in one read (cap <= 2000
  -- runs: 4000 fields).
  local got = redis.call('HMGET', dq.meta, unpack(fields))
  for i, s in ipairs(dq.served) do
    local m = meta_parse(got[2 * i - 1])
    local member = dq.run_prefix .. s.vm .. ':' .. s.id
    m.st, m.dl, m.ld = 'f', token0 + i, dq.lease_deadline
    if m.ttl > 0 then expiring[#expiring + 1] = member end
    hargs[#hargs + 1] = s.id
    hargs[#hargs + 1] = meta_format(m)
    ids[i] = s.id
    members[i] = member
    lease_args[#lease_args + 1] = dq.lease_deadline
    lease_args[#lease_args + 1] = member
    out[#out + 1] = s.id
    out[#out + 1] = s.vm
    out[#out + 1] = got[2 * i]
    out[#out + 1] = m.att
    out[#out + 1] = m.dl
  end
  redis.call('HSET', dq.meta, unpack(hargs))
  redis.call('SADD', dq.env_inflight, unpack(members))
  redis.call('SADD', dq.queue_inflight, unpack(ids))
  redis.call('ZADD', dq.leases, unpack(lease_args))
  if #expiring > 0 then redis.call('ZREM', dq.ttl_set, unpack(expiring)) end
  master_refresh(dq.ck_index, dq.delay_index, dq.master, dq.qm)
  return out
end
-- A window is the part of a sorted set a dequeue read: its first n entries
-- ({vm, s} in ZSET order: score, then member), kept sorted in memory as
-- scores change. An entry whose new score sorts after the n-th entry read
-- leaves the window, because unread entries may sort before it; a set read
-- whole (raw holds at most n entries) has no such bound. raw is a ZRANGE
-- WITHSCORES reply of up to n + 1 entries.
local function entry_before(a, b) return a.s < b.s or (a.s == b.s and a.vm < b.vm) end

local function window_new(raw, n)
  local list = {}
  for i = 1, #raw, 2 do list[#list + 1] = { vm = raw[i], s = num(raw[i + 1]) } end
  local w = { list = list, bound = nil }
  if #list > n then
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
local OWN_KEYS, OWN_ARGS = 10, 12
local dq = dq_open(KEYS, ARGV)
if dq.cap <= 0 then return {} end
local hooks = hooks_open(KEYS, ARGV, OWN_KEYS, OWN_ARGS, dq.now)
dq_promote(dq, hooks)

-- Age order: the first scan entries of ckIndex (lowest head ready score,
-- then member); each serve takes the first servable one.
-- Without a per-key limit every variant in ckIndex is servable and each
-- serve moves one variant back, so the call can only serve among the first
-- cap: reading further (a costly WITHSCORES reply) would change nothing.
local reach = dq.scan
if dq.key_limit <= 0 then reach = math.min(dq.scan, dq.cap) end
local age = window_new(redis.call('ZRANGE', dq.ck_index, 0, reach, 'WITHSCORES'), reach)
local function servable(vm)
  return not dq_at_limit(dq, vm) and dq_head(dq, vm) ~= nil
end
while #dq.served < dq.cap do
  local vm = window_first(age, servable)
  if vm == nil then break end
  local nxt = dq_take(dq, vm)
  if nxt == nil then
    window_remove(age, vm)
  else
    window_move(age, vm, nxt)
  end
end
hooks.finish()
return dq_finish(dq)
