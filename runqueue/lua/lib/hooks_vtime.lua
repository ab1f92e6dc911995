-- Scheduler flag on: keep each variant's virtual start tag (see vtime/doc.go,
-- the model these functions implement).
-- KEYS[NK+1] -> queue ckVtime ZSET (variant member, score tag S)
-- KEYS[NK+2] -> queue ckVtimeFloor STRING "V|L|c|r|nw": clock V, last
--               newcomer tag L ("" for none), discovery cursor c, time (ms)
--               ckVtime's TTL was last refreshed r, weight overrides nw (-1 unknown)
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
  if not raw then return { v = 0, l = nil, c = 0, r = 0, nw = -1 } end
  local v, l, c, r, nw = string.match(raw, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
  return { v = tonumber(v), l = tonumber(l), c = tonumber(c), r = tonumber(r), nw = tonumber(nw) }
end

-- Persist the floor with the state TTL; refresh ckVtime's TTL at most once
-- per half TTL, which keeps it alive while the queue is used without an
-- EXPIRE on every call.
local function floor_write(f)
  if now - f.r >= vt.ttl * 500 then
    redis.call('EXPIRE', vt.tags, vt.ttl)
    f.r = now
  end
  local l = ''
  if f.l ~= nil then l = fmt(f.l) end
  redis.call('SET', vt.floor, fmt(f.v) .. '|' .. l .. '|' .. string.format('%d', f.c) .. '|' ..
    string.format('%d', f.r) .. '|' .. string.format('%d', f.nw), 'EX', vt.ttl)
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

-- A variant's last ready run left outside a dequeue: park its tag when it
-- is above V (it owes service), and leave the fair order.
local function on_ready_empty(vm)
  local s = redis.call('ZSCORE', vt.tags, vm)
  if not s then return end
  if tonumber(s) > floor_read().v then
    redis.call('ZADD', vt.idle, s, vm)
    redis.call('EXPIRE', vt.idle, vt.ttl)
  end
  redis.call('ZREM', vt.tags, vm)
end
