-- redrive: a dead-lettered run goes back to its variant, ready now, with
-- its attempts reset.
--
-- KEYS[1] -> queue runs HASH (encoded id -> record)
-- KEYS[2] -> queue ckIndex ZSET
-- KEYS[3] -> queue delayIndex ZSET
-- KEYS[4] -> queue depth HASH
-- KEYS[5] -> shard master ZSET
-- KEYS[6] -> queue dead ZSET
-- KEYS[7] -> env dead HASH (queue member -> dead-lettered runs)
-- ARGV[1] -> now (ms)
-- ARGV[2] -> encoded message id
-- ARGV[3] -> variant member
-- ARGV[4] -> run member
-- ARGV[5] -> priority step (ms)
-- ARGV[6] -> queue member
-- ARGV[7] -> wake channel ("" to not publish)
-- ARGV[8] -> variant key base (keys.Queue.VariantBase)
-- Flag on: KEYS[8..10] and ARGV[9..11] follow, the scheduler's (see
-- lib/hooks_vtime).
-- Returns: 1 redriven, 2 already live (queued or in flight: a redrive sent
-- again after its first call went through finds it so).
-- Errors: RQ_NOT_FOUND.
--@include record
--@include hooks
--@include place
local q = { runs = KEYS[1], ck_index = KEYS[2], delay_index = KEYS[3], depth = KEYS[4],
            master = KEYS[5], qm = ARGV[6] }
local dead, env_dead = KEYS[6], KEYS[7]
local now = ARGV[1] + 0 -- (client-written integers: see num in lib/record)
local id, vm, member = ARGV[2], ARGV[3], ARGV[4]
local priority_step = ARGV[5] + 0
local wake = ARGV[7]
local OWN_KEYS, OWN_ARGS = 7, 8
local hooks = hooks_open(KEYS, ARGV, OWN_KEYS, OWN_ARGS, now)

local rec = redis.call('HGET', q.runs, id)
local r = rec and rec_parse(rec)
if not r or r.vm ~= vm then return redis.error_reply('RQ_NOT_FOUND no such run') end
if redis.call('ZREM', dead, member) == 0 then return 2 end
if redis.call('HINCRBY', env_dead, q.qm, '-1') <= 0 then redis.call('HDEL', env_dead, q.qm) end
-- (no last settled token: a retry of the nack that dead-lettered it is
-- not answered from the redriven run)
-- (the time as Go wrote it, ARGV[1]: a Lua number joined to a string
-- prints as %.14g, 1.5e+14 from 1e14 ms on, which no reader parses)
redis.call('HSET', q.runs, id, rec_with(rec, r, 1, ARGV[1], '0'))
place(q, variant_keys(ARGV[8], vm), hooks, id, vm, now, now - r.pr * priority_step, now)
if wake ~= '' then redis.call('PUBLISH', wake, q.qm) end
hooks:finish()
return 1
