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
