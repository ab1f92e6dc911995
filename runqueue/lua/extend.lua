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
--@include meta
--@include holder
local meta, leases = KEYS[1], KEYS[2]
local id, vm, member, token, deadline = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])

local m, err = load_held(meta, id, vm, token, 0)
if err then return err end
m.ld = deadline
redis.call('HSET', meta, id, meta_format(m))
redis.call('ZADD', leases, 'XX', deadline, member)
return 1
