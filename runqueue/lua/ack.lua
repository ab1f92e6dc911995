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
--@include meta
--@include holder
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
