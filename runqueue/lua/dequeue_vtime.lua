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
--@include meta
--@include hooks
--@include place
--@include dequeue_begin
--@include window
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
--@include dequeue_end
return out
