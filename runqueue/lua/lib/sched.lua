-- The fair scheduler's state in Redis (flag on only): lib/sched_reg (the
-- layout, the state's scalars, registration) and the rest of what the
-- scripts that serve, drain and release variants do. vtime/ is the model
-- these functions implement; see vtime/doc.go for the rules.
--@include sched_reg

-- The variant member and the code of a competing or gated member.
local function sched_split(member)
  return string.sub(member, SCHED.VM_AT), string.sub(member, 1, SCHED.CODE_LEN)
end

-- A variant's state-hash value: { code, gated, tag (when gated), waiting, r }.
local function sched_parse(v)
  local code, f, t, r = string.match(v, '^(%d+)([gw]?)(%d*)|?(%d*)$')
  return { code = code, gated = f == 'g', tag = t ~= '' and t + 0 or nil, waiting = f == 'w',
           r = r ~= '' and r + 0 or 0 }
end

-- The lane's member after the first `after` (0-based rank), or nil.
local function sched_lane_at(S, after)
  return redis.call('ZRANGEBYSCORE', S.z, SCHED.WAIT_MIN, SCHED.WAIT_END, 'LIMIT', after, '1')[1]
end

-- Drop parked tags at or below v (worth nothing), then all but the highest
-- idle_max (the idle region holds the lowest scores: ranks from 0).
local function sched_reap(S, v)
  redis.call('ZREMRANGEBYSCORE', S.z, SCHED.IDLE_MIN, sched_fmt(v - SCHED.G))
  local n = redis.call('ZCOUNT', S.z, SCHED.IDLE_MIN, SCHED.IDLE_END)
  if n > S.idle_max then redis.call('ZREMRANGEBYRANK', S.z, '0', n - S.idle_max - 1) end
end

-- A state whose ckVtime went without its hash (deleted by hand, evicted):
-- the dequeue found no sentinel in its first read of the competing region.
-- Both keys go: the next call starts the state again, as if it had
-- expired, and finds every variant with ready work by discovery.
local function sched_broken(S)
  redis.call('DEL', S.h, S.z)
  S.st = nil
end

-- A variant's last ready run left outside a dequeue: it leaves the
-- competition (and the lane: a head that leaves unserved hands its tag to
-- the next newcomer), its tag parked when above V.
local function sched_drained(S, vm)
  local hv = redis.call('HGET', S.h, vm)
  if not hv then return end
  local st = sched_state(S)
  -- A state started again (sched_state found no clock): nothing is
  -- registered. (No script registers a variant before it drains or
  -- releases one.)
  if S.fresh then return end
  local rg = sched_parse(hv)
  local member = rg.code .. vm
  local u
  if rg.gated then
    u = rg.tag
    st.ng = st.ng - 1
  else
    u = num(redis.call('ZSCORE', S.z, member)) -- nil when queued in the lane
  end
  redis.call('HDEL', S.h, vm)
  redis.call('ZREM', S.z, member, vm)
  if rg.waiting and st.lh == vm then
    st.lh = ''
    local nxt = sched_lane_at(S, 0)
    if nxt then
      local nv = sched_parse(redis.call('HGET', S.h, nxt))
      redis.call('ZADD', S.z, sched_fmt(math.max(st.v, u or st.v)), nv.code .. nxt)
      st.lh = nxt
    end
  end
  if u and u > st.v then
    redis.call('ZADD', S.z, sched_fmt(u - SCHED.G), vm)
    sched_reap(S, st.v)
  end
end

-- Run cmd key with args in chunks of at most 1000 (Redis Lua refuses to
-- unpack much more than 8,000 values), step values at a time.
local function sched_chunked(cmd, key, args, step)
  local n = step * math.floor(1000 / step)
  for i = 1, #args, n do
    redis.call(cmd, key, unpack(args, i, math.min(i + n - 1, #args)))
  end
end

-- HMGET of any number of fields (in chunks of 1000). Up to 1000 fields,
-- the reply itself (false for a missing field), not a copy.
local function sched_hmget(h, fields)
  if #fields == 0 then return {} end
  if #fields <= 1000 then return redis.call('HMGET', h, unpack(fields)) end
  local out = {}
  for i = 1, #fields, 1000 do
    local part = redis.call('HMGET', h, unpack(fields, i, math.min(i + 999, #fields)))
    for j = 1, #part do out[i + j - 1] = part[j] end
  end
  return out
end

-- Slots of the variants vms freed (ack, nack, lease recovery, dead
-- letter): a gated one competes again, at max(S, V), whatever the key
-- limit is now (one read for all of them).
local function sched_released(S, vms)
  local hvs = sched_hmget(S.h, vms)
  for i, vm in ipairs(vms) do
    local rg = hvs[i] and sched_parse(hvs[i])
    if rg and rg.gated then
      local st = sched_state(S)
      if S.fresh then return end -- a state started again: see sched_drained
      local u, r = rg.tag, rg.r
      if not u or u < st.v then u, r = st.v, 0 end
      redis.call('ZADD', S.z, sched_fmt(u), rg.code .. vm)
      redis.call('HSET', S.h, vm, sched_value(rg.code, false, false, r))
      st.ng = st.ng - 1
    end
  end
end

-- The hooks of the scripts that move runs (see hooks_vtime). look: a
-- freed slot looks for a gated variant (see hooks_vtime); when it does
-- not, there is none to find, or the dequeue's un-gating comes first.
-- (Methods over the hooks' own table, called hooks:name(...), so that a
-- call makes one table and no closures.)
local function sched_hook_ready_start(H, vm) sched_register(H.S, vm, false) end
local function sched_hook_ready_empty(H, vm) sched_drained(H.S, vm) end
local function sched_hook_released(H, vms) if H.look then sched_released(H.S, vms) end end
local function sched_hook_finish(H) sched_save(H.S) end
local function sched_hooks(S, look)
  return { S = S, look = look, ready_start = sched_hook_ready_start, ready_empty = sched_hook_ready_empty,
           released = sched_hook_released, finish = sched_hook_finish }
end
