-- enqueue: store a run and queue it in its variant (ready or delayed).
--
-- KEYS[1] -> queue runs HASH (field encoded id -> run metadata, see meta;
--            field encoded id .. ":p" -> opaque payload bytes)
-- KEYS[2] -> variant ready ZSET (encoded id, score ready score ms)
-- KEYS[3] -> variant delayed ZSET (encoded id, score available_at ms)
-- KEYS[4] -> queue ckIndex ZSET (variant member, score head ready score ms)
-- KEYS[5] -> queue delayIndex ZSET (variant member, score earliest available_at ms)
-- KEYS[6] -> queue depth HASH (r: ready count, d: delayed count)
-- KEYS[7] -> shard master ZSET (queue member, score earliest work ms)
-- KEYS[8] -> shard ttl ZSET (run member, score expiry deadline ms)
-- ARGV[1] -> now (ms)
-- ARGV[2] -> encoded message id
-- ARGV[3] -> variant member
-- ARGV[4] -> payload
-- ARGV[5] -> priority 0..9
-- ARGV[6] -> available_at (ms)
-- ARGV[7] -> ready score (ms): available_at - priority * priority step
-- ARGV[8] -> expiry deadline (ms), 0 for no TTL
-- ARGV[9] -> run member (for the ttl ZSET)
-- ARGV[10] -> queue member (for the master ZSET)
-- ARGV[11] -> maximum queued runs in the queue, 0 for no limit
-- ARGV[12] -> maximum queued runs in the variant, 0 for no limit
-- ARGV[13] -> wake channel ("" to not publish)
-- Flag on: KEYS[9..11] and ARGV[14..16] follow, the scheduler's (see
-- lib/hooks_vtime).
-- Returns: 1 queued, 0 already queued with the same body (no-op).
-- Errors: RQ_CONFLICT (same id, other body), RQ_QUEUE_FULL, RQ_KEY_FULL.
--@include meta
local q = { meta = KEYS[1], ck_index = KEYS[4], delay_index = KEYS[5],
            depth = KEYS[6], master = KEYS[7], qm = ARGV[10] }
local v = { ready = KEYS[2], delayed = KEYS[3] }
local ttl_set = KEYS[8]
local now = tonumber(ARGV[1])
local id = ARGV[2]
local vm = ARGV[3]
local payload = ARGV[4]
local priority = tonumber(ARGV[5])
local available_at = tonumber(ARGV[6])
local ready_score = tonumber(ARGV[7])
local expires_at = tonumber(ARGV[8])
local run_member = ARGV[9]
local max_queue = tonumber(ARGV[11])
local max_key = tonumber(ARGV[12])
local wake = ARGV[13]
--@include hooks
--@include place
local OWN_KEYS, OWN_ARGS = 8, 13
local hooks = hooks_open(KEYS, ARGV, OWN_KEYS, OWN_ARGS, now)

local existing = redis.call('HGET', q.meta, id)
if existing then
  local m = meta_parse(existing)
  if m.vm == vm and redis.call('HGET', q.meta, id .. ':p') == payload then
    return 0
  end
  return redis.error_reply('RQ_CONFLICT message id exists with another body')
end
if max_queue > 0 then
  local d = redis.call('HMGET', q.depth, 'r', 'd')
  if (tonumber(d[1]) or 0) + (tonumber(d[2]) or 0) >= max_queue then
    return redis.error_reply('RQ_QUEUE_FULL queue depth limit reached')
  end
end
if max_key > 0 then
  if redis.call('ZCARD', v.ready) + redis.call('ZCARD', v.delayed) >= max_key then
    return redis.error_reply('RQ_KEY_FULL concurrency key depth limit reached')
  end
end

local st = 'd'
if available_at <= now then st = 'r' end
-- dl is the delivery token of the current holder: 0 until a dequeue gives
-- one from the shard's counter (so tokens never repeat, whatever ids are
-- reused).
redis.call('HSET', q.meta, id, meta_format({ st = st, att = 1, dl = 0, ld = 0, vm = vm,
  pr = priority, at = available_at, ttl = expires_at }), id .. ':p', payload)
if expires_at > 0 then
  redis.call('ZADD', ttl_set, expires_at, run_member)
end
place_wake(q, v, hooks, id, vm, available_at, ready_score, now, wake)
hooks.finish()
return 1
