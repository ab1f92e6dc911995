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
-- ARGV[5] -> now (ms)
-- Flag on: KEYS[6..8] and ARGV[6..8] follow, the scheduler's (see
-- lib/hooks_vtime).
-- Returns: 1 acked, 0 the run no longer exists (acked before: a retried
-- ack whose first call went through finds it so).
-- Errors: RQ_NOT_IN_FLIGHT, RQ_LEASE_LOST.
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
-- Scheduler flag off: no scheduler state; the hooks do nothing. (The
-- flag-on build includes hooks_vtime instead, with the same function.)
local function hooks_open(keys, args, own_keys, own_args, now)
  local nop = function() end
  return { ready_start = nop, ready_empty = nop, released = nop, finish = nop }
end
local meta, env_inflight, queue_inflight, variant_inflight, leases =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local id, vm, member, token = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local OWN_KEYS, OWN_ARGS = 5, 5
local hooks = hooks_open(KEYS, ARGV, OWN_KEYS, OWN_ARGS, tonumber(ARGV[5]))

if redis.call('HEXISTS', meta, id) == 0 then return 0 end
local _, err = load_held(meta, id, vm, token, 0)
if err then return err end
redis.call('HDEL', meta, id, id .. ':p')
redis.call('SREM', env_inflight, member)
redis.call('SREM', queue_inflight, id)
redis.call('SREM', variant_inflight, id)
redis.call('ZREM', leases, member)
hooks.released(vm)
hooks.finish()
return 1
