-- expire: TTL sweep of one queued run whose deadline passed.
--
-- KEYS[1] -> queue runs HASH (encoded id -> record)
-- KEYS[2] -> queue ckIndex ZSET
-- KEYS[3] -> queue delayIndex ZSET
-- KEYS[4] -> queue depth HASH
-- KEYS[5] -> shard master ZSET
-- KEYS[6] -> shard ttl ZSET (run member, score expiry deadline ms)
-- ARGV[1] -> now (ms)
-- ARGV[2] -> encoded message id
-- ARGV[3] -> variant member
-- ARGV[4] -> run member
-- ARGV[5] -> queue member
-- ARGV[6] -> variant key base (keys.Queue.VariantBase)
-- Flag on: KEYS[7..9] and ARGV[7..9] follow, the scheduler's (see
-- lib/hooks_vtime).
-- Returns: 1 expired, 0 nothing to expire (gone, in flight, dead, or not
-- yet due). The dequeue drops the ttl entry of each run it serves and a
-- delivered run's record has no deadline, so an entry left behind (a run
-- acked or deleted meanwhile) finds no deadline here and just goes.
--@include record
--@include hooks
--@include place
local q = { runs = KEYS[1], ck_index = KEYS[2], delay_index = KEYS[3], depth = KEYS[4],
            master = KEYS[5], qm = ARGV[5] }
local ttl_set = KEYS[6]
local now = ARGV[1] + 0 -- (client-written integers: see num in lib/record)
local id, vm, member = ARGV[2], ARGV[3], ARGV[4]
local OWN_KEYS, OWN_ARGS = 6, 6
local hooks = hooks_open(KEYS, ARGV, OWN_KEYS, OWN_ARGS, now)

local rec = redis.call('HGET', q.runs, id)
local r = rec and rec_parse(rec)
if not r or r.vm ~= vm or r.ttl == '0' then
  redis.call('ZREM', ttl_set, member)
  return 0
end
if tonumber(r.ttl) > now then return 0 end
redis.call('ZREM', ttl_set, member)
if not unplace(q, variant_keys(ARGV[6], vm), hooks, id, vm) then return 0 end
redis.call('HDEL', q.runs, id)
hooks:finish()
return 1
