-- expire: TTL sweep of one queued run whose deadline passed.
--
-- KEYS[1] -> queue runs HASH (metadata and payload fields)
-- KEYS[2] -> variant ready ZSET
-- KEYS[3] -> variant delayed ZSET
-- KEYS[4] -> queue ckIndex ZSET
-- KEYS[5] -> queue delayIndex ZSET
-- KEYS[6] -> queue depth HASH
-- KEYS[7] -> shard master ZSET
-- KEYS[8] -> shard ttl ZSET (run member, score expiry deadline ms)
-- ARGV[1] -> now (ms)
-- ARGV[2] -> encoded message id
-- ARGV[3] -> variant member
-- ARGV[4] -> run member
-- ARGV[5] -> queue member
-- Flag on: KEYS[9..11] and ARGV[6..8] follow, the scheduler's (see
-- lib/hooks_vtime).
-- Returns: 1 expired, 0 nothing to expire (gone, in flight, or not yet due).
--@include meta
local q = { meta = KEYS[1], ck_index = KEYS[4], delay_index = KEYS[5], depth = KEYS[6],
            master = KEYS[7], qm = ARGV[5] }
local v = { ready = KEYS[2], delayed = KEYS[3] }
local ttl_set = KEYS[8]
local now = tonumber(ARGV[1])
local id, vm, member = ARGV[2], ARGV[3], ARGV[4]
--@include hooks
--@include place
local OWN_KEYS, OWN_ARGS = 8, 5
local hooks = hooks_open(KEYS, ARGV, OWN_KEYS, OWN_ARGS, now)

local raw = redis.call('HGET', q.meta, id)
if not raw then
  redis.call('ZREM', ttl_set, member)
  return 0
end
local m = meta_parse(raw)
if m.vm ~= vm or (m.st ~= 'r' and m.st ~= 'd') or m.ttl == 0 then
  redis.call('ZREM', ttl_set, member)
  return 0
end
if m.ttl > now then return 0 end
unplace(q, v, hooks, id, vm, m.st)
redis.call('HDEL', q.meta, id, id .. ':p')
redis.call('ZREM', ttl_set, member)
hooks.finish()
return 1
