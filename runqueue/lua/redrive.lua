-- redrive: a dead-lettered run goes back to its variant, ready now, with
-- its attempts reset.
--
-- KEYS[1] -> queue meta HASH
-- KEYS[2] -> variant ready ZSET
-- KEYS[3] -> variant delayed ZSET
-- KEYS[4] -> queue ckIndex ZSET
-- KEYS[5] -> queue delayIndex ZSET
-- KEYS[6] -> queue depth HASH
-- KEYS[7] -> shard master ZSET
-- KEYS[8] -> queue dead ZSET
-- KEYS[9] -> env dead HASH (queue member -> dead-lettered runs)
-- ARGV[1] -> now (ms)
-- ARGV[2] -> encoded message id
-- ARGV[3] -> variant member
-- ARGV[4] -> run member
-- ARGV[5] -> priority step (ms)
-- ARGV[6] -> queue member
-- ARGV[7] -> wake channel ("" to not publish)
-- Flag on: KEYS[10..12] and ARGV[8..10] follow, the scheduler's (see
-- lib/hooks_vtime).
-- Returns: 1 redriven, 2 already live (queued or in flight: a retried
-- redrive whose first call went through finds it so).
-- Errors: RQ_NOT_FOUND.
--@include meta
local q = { meta = KEYS[1], ck_index = KEYS[4], delay_index = KEYS[5], depth = KEYS[6],
            master = KEYS[7], qm = ARGV[6] }
local v = { ready = KEYS[2], delayed = KEYS[3] }
local dead, env_dead = KEYS[8], KEYS[9]
local now = tonumber(ARGV[1])
local id, vm, member = ARGV[2], ARGV[3], ARGV[4]
local priority_step = tonumber(ARGV[5])
local wake = ARGV[7]
--@include hooks
--@include place
local OWN_KEYS, OWN_ARGS = 9, 7
local hooks = hooks_open(KEYS, ARGV, OWN_KEYS, OWN_ARGS, now)

local raw = redis.call('HGET', q.meta, id)
if not raw then return redis.error_reply('RQ_NOT_FOUND no such run') end
local m = meta_parse(raw)
if m.vm ~= vm then return redis.error_reply('RQ_NOT_FOUND no such run under this concurrency key') end
if m.st ~= 'x' then return 2 end
redis.call('ZREM', dead, member)
if redis.call('HINCRBY', env_dead, q.qm, -1) <= 0 then redis.call('HDEL', env_dead, q.qm) end
m.st, m.att, m.at, m.ld, m.ttl = 'r', 1, now, 0, 0
redis.call('HSET', q.meta, id, meta_format(m))
place(q, v, hooks, id, vm, now, now - m.pr * priority_step, now)
if wake ~= '' then redis.call('PUBLISH', wake, q.qm) end
hooks.finish()
return 1
