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
