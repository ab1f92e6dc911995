-- extend: heartbeat; move the lease deadline of a held run.
--
-- KEYS[1] -> queue runs HASH (encoded id -> record)
-- KEYS[2] -> queue held HASH ("<variant member>:<encoded id>" -> delivery token)
-- KEYS[3] -> shard leases ZSET (run member, score lease deadline ms)
-- ARGV[1] -> encoded message id
-- ARGV[2] -> variant member
-- ARGV[3] -> run member
-- ARGV[4] -> delivery token of the holder
-- ARGV[5] -> new lease deadline (ms)
-- Returns: 1.
-- Errors: RQ_NOT_FOUND, RQ_NOT_IN_FLIGHT, RQ_LEASE_LOST.
--@include record
--@include held
local runs, held, leases = KEYS[1], KEYS[2], KEYS[3]
local id, vm, member, token, deadline = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local _, err = held_check(runs, held, leases, vm, id, member, token, 0)
if err then return redis.error_reply(HELD_ERRORS[err]) end
-- The entry is moved by a removal and an add, not ZADD XX: on a Redis at
-- maxmemory a script is refused at its first write that may add memory
-- (a ZADD, whatever its XX), and a removal first lets the heartbeat of a
-- long run through.
if redis.call('ZREM', leases, member) == 1 then redis.call('ZADD', leases, deadline, member) end
return 1
