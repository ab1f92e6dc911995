-- The fair scheduler's state in Redis (flag on only): lib/sched_reg (the
-- layout, the state's scalars, registration) and the rest of what the
-- scripts that serve, drain and release variants do. vtime/ is the model
-- these functions implement; see vtime/doc.go for the rules.
--@include sched_reg

-- The variant member and the code of a competing or gated member.
local function sched_split(member)
  return string.sub(member, SCHED.VM_AT), string.sub(member, 1, SCHED.CODE_LEN)
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

-- A read of key by any number of fields or members (HMGET, ZMSCORE), in
-- chunks of 1000 (unpack's limit). Up to 1000, the reply itself (false for
-- a missing one), not a copy.
local function sched_mread(cmd, key, fields)
  if #fields == 0 then return {} end
  if #fields <= 1000 then return redis.call(cmd, key, unpack(fields)) end
  local out = {}
  for i = 1, #fields, 1000 do
    local part = redis.call(cmd, key, unpack(fields, i, math.min(i + 999, #fields)))
    for j = 1, #part do out[i + j - 1] = part[j] end
  end
  return out
end

local function sched_hmget(h, fields) return sched_mread('HMGET', h, fields) end

-- A batch of registrations (sched_register_many, the dequeue's
-- discovery): their writes gathered, and what the later ones must see of
-- the earlier ones (the top tag a newcomer compares with V: B.pmax over
-- B.top, read once; ckVtime's size: B.delta).
local function sched_batch()
  return { zrem = {}, zadd = {}, hset = {}, delta = 0, top = nil, pmax = false }
end

-- Registers vm, which has no tag (p: its parked tag, or false), into
-- batch B, as sched_register would.
local function sched_admit_into(S, st, vm, discovered, p, B)
  local u, code, waiting, seq = sched_admit(S, st, vm, discovered, p, B)
  sched_entries(B.zadd, vm, u, code, waiting, seq)
  if u then
    B.delta = B.delta + 1
    if not B.pmax or u > B.pmax then B.pmax = u end
  end
  if waiting then B.delta = B.delta + 1 end
  local h = B.hset
  h[#h + 1] = vm
  h[#h + 1] = sched_value(code, false, waiting, 0)
end

-- Variants that gained their first ready run, in order (a script's hooks
-- gather them: see hooks_vtime): what sched_register(S, vm, false) does
-- for each in turn, with one HMGET and one ZMSCORE for all of them before
-- and their writes in one ZREM, ZADD and HSET after. In between, nothing
-- reads what they write but the registrations themselves, and those see
-- it: the lane's head (st.lh), the top tag a newcomer compares with V (the
-- tags registered before it count: B.pmax) and ckVtime's size (B.delta);
-- a variant named twice registers once, as its second call would find it
-- registered. A state started again (sched_state found none, or found it
-- broken) drops what was read of it before: every variant after that is
-- unregistered and has no parked tag. vms may also be one variant member,
-- a string (most calls make one variant ready, and pay for no list).
-- found, when given, holds the variants that register as discovered ones,
-- at V (the dequeue's promotion: the cold mark).
local function sched_register_many(S, vms, found)
  if type(vms) == 'string' then
    sched_register(S, vms, false)
    return
  end
  found = found or {}
  local k = #vms
  if k == 1 or k > 1000 then
    -- (more than the reads' arguments may be: one at a time; only a
    -- dequeue's promotion gathers that many, when more than 1,000 keys'
    -- delayed runs fall due at once and ScanLimit lets it promote them)
    for i = 1, k do sched_register(S, vms[i], found[vms[i]] or false) end
    return
  end
  local st, regs, parked, off = S.st, nil, nil, 0
  if st then
    regs = redis.call('HMGET', S.h, unpack(vms))
    parked = redis.call('ZMSCORE', S.z, unpack(vms))
  else
    local args = {}
    for i = 1, k do args[i] = vms[i] end
    for i, f in ipairs(SCHED_REG_FIELDS) do args[k + i] = f end
    regs = redis.call('HMGET', S.h, unpack(args))
    parked = redis.call('ZMSCORE', S.z, '', unpack(vms))
    off = 1
  end
  local B = sched_batch()
  local seen, void, n = {}, false, 0
  for i = 1, k do
    local vm = vms[i]
    if not seen[vm] then
      seen[vm] = true
      if void or not regs[i] then
        if not st then
          st = sched_state(S, regs, k, parked[1], SCHED_REG_FIELDS)
          if S.fresh then
            -- (the state started again: the variants seen before this
            -- one were found registered in the state that is gone)
            void, seen = true, { [vm] = true }
          end
        end
        local p = false
        if not void then p = parked[i + off] end
        sched_admit_into(S, st, vm, found[vm] or false, p, B)
        n = n + 1
      end
    end
  end
  if n == 0 then return end
  sched_chunked('ZREM', S.z, B.zrem, 1)
  sched_chunked('ZADD', S.z, B.zadd, 2)
  local h = B.hset
  h[#h + 1] = 's'
  h[#h + 1] = sched_fmt(st.s)
  if st.lh ~= S.was.lh then
    h[#h + 1] = 'lh'
    h[#h + 1] = st.lh
  end
  sched_chunked('HSET', S.h, h, 2)
  S.was.s, S.was.lh = st.s, st.lh
end

-- A hooks table for a step that only makes variants ready (the dequeue's
-- promotion): it gathers them in order, in its own list part, for
-- sched_register_many.
local function sched_gather_ready_start(G, vm) G[#G + 1] = vm end
local function sched_gather() return { ready_start = sched_gather_ready_start } end

-- Slots of the variants vms freed (ack, nack, lease recovery, dead
-- letter, a dequeue's runs expired): a gated one competes again, at
-- max(S, V), whatever the key limit is now (one read for all of them).
-- own: the caller is a dequeue, which may have started the state and
-- gated variants in it itself.
local function sched_released(S, vms, own)
  local hvs = sched_hmget(S.h, vms)
  for i, vm in ipairs(vms) do
    local rg = hvs[i] and sched_parse(hvs[i])
    if rg and rg.gated then
      local st = sched_state(S)
      if S.fresh and not own then return end -- a state started again: see sched_drained
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
local function sched_hook_ready_start_many(H, vms) sched_register_many(H.S, vms) end
local function sched_hook_ready_empty(H, vm) sched_drained(H.S, vm) end
local function sched_hook_released(H, vms) if H.look then sched_released(H.S, vms) end end
local function sched_hook_finish(H) sched_save(H.S) end
local function sched_hooks(S, look)
  return { S = S, look = look, ready_start_many = sched_hook_ready_start_many,
           ready_empty = sched_hook_ready_empty, released = sched_hook_released, finish = sched_hook_finish }
end
