-- expire: TTL sweep of one queued run whose deadline passed.
--
-- KEYS[1] -> queue meta HASH
-- KEYS[2] -> queue payload HASH
-- KEYS[3] -> variant ready ZSET
-- KEYS[4] -> variant delayed ZSET
-- KEYS[5] -> queue ckIndex ZSET
-- KEYS[6] -> queue delayIndex ZSET
-- KEYS[7] -> queue depth HASH
-- KEYS[8] -> shard master ZSET
-- KEYS[9] -> shard ttl ZSET (run member, score expiry deadline ms)
-- ARGV[1] -> now (ms)
-- ARGV[2] -> encoded message id
-- ARGV[3] -> variant member
-- ARGV[4] -> run member
-- ARGV[5] -> queue member
-- Returns: 1 expired, 0 nothing to expire (gone, in flight, or not yet due).
--@include meta
local q = { meta = KEYS[1], ck_index = KEYS[5], delay_index = KEYS[6], depth = KEYS[7],
            master = KEYS[8], qm = ARGV[5] }
local v = { ready = KEYS[3], delayed = KEYS[4] }
local payloads, ttl_set = KEYS[2], KEYS[9]
local now = tonumber(ARGV[1])
local id, vm, member = ARGV[2], ARGV[3], ARGV[4]
local NK, NA = 9, 5
--@include hooks
--@include place

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
unplace(q, v, id, vm, m.st)
redis.call('HDEL', q.meta, id)
redis.call('HDEL', payloads, id)
redis.call('ZREM', ttl_set, member)
return 1
