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
