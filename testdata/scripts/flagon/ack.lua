-- ack: a run is done; remove it everywhere and release its concurrency.
--
-- KEYS[1] -> queue runs HASH (metadata and payload fields)
-- KEYS[2] -> env inflight SET (run members)
-- KEYS[3] -> queue inflight SET (encoded ids)
-- KEYS[4] -> variant inflight SET (encoded ids)
-- KEYS[5] -> shard leases ZSET (run member, score lease deadline ms)
-- ARGV[1] -> encoded message id
-- ARGV[2] -> variant member
-- ARGV[3] -> run member
-- ARGV[4] -> delivery token of the holder
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
local meta, env_inflight, queue_inflight, variant_inflight, leases =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local id, vm, member, token = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])

local _, err = load_held(meta, id, vm, token, 0)
if err then return err end
redis.call('HDEL', meta, id, id .. ':p')
redis.call('SREM', env_inflight, member)
redis.call('SREM', queue_inflight, id)
redis.call('SREM', variant_inflight, id)
redis.call('ZREM', leases, member)
return 1
