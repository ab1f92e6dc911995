-- extend: heartbeat; move the lease deadline of a held run.
--
-- KEYS[1] -> queue meta HASH
-- KEYS[2] -> shard leases ZSET (run member, score lease deadline ms)
-- ARGV[1] -> encoded message id
-- ARGV[2] -> variant member
-- ARGV[3] -> run member
-- ARGV[4] -> delivery token of the holder
-- ARGV[5] -> new lease deadline (ms)
-- Returns: 1.
-- Errors: RQ_NOT_FOUND, RQ_NOT_IN_FLIGHT, RQ_LEASE_LOST.
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
-- Load run id of variant vm and check that it is in flight under the lease
-- token the caller holds (token 0: any holder whose lease has passed now).
-- Returns the parsed metadata, or nil and an error reply.
local function load_held(meta, id, vm, token, now)
  local raw = redis.call('HGET', meta, id)
  if not raw then return nil, redis.error_reply('RQ_NOT_FOUND no such run') end
  local m = meta_parse(raw)
  if m.vm ~= vm then return nil, redis.error_reply('RQ_NOT_FOUND no such run under this concurrency key') end
  if m.st ~= 'f' then return nil, redis.error_reply('RQ_NOT_IN_FLIGHT run is not in flight') end
  if token > 0 then
    if m.dl ~= token then return nil, redis.error_reply('RQ_LEASE_LOST lease is held by a later delivery') end
  elseif m.ld > now then
    return nil, redis.error_reply('RQ_LEASE_ACTIVE lease has not expired')
  end
  return m
end
local meta, leases = KEYS[1], KEYS[2]
local id, vm, member, token, deadline = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])

local m, err = load_held(meta, id, vm, token, 0)
if err then return err end
m.ld = deadline
redis.call('HSET', meta, id, meta_format(m))
redis.call('ZADD', leases, 'XX', deadline, member)
return 1
