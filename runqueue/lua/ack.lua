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
--@include meta
--@include holder
--@include hooks
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
