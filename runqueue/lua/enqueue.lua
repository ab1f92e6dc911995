-- enqueue: store runs of one base queue and queue each in its variant
-- (ready or delayed). Each run is all or nothing; a run whose id exists is
-- a no-op when its variant and payload are the same (an idempotent retry)
-- and a conflict otherwise.
--
-- KEYS[1] -> queue runs HASH (encoded id -> record, see lib/record)
-- KEYS[2] -> queue ckIndex ZSET (variant member, score head ready score ms)
-- KEYS[3] -> queue delayIndex ZSET (variant member, score earliest available_at ms)
-- KEYS[4] -> queue depth HASH (r: ready count, d: delayed count)
-- KEYS[5] -> shard master ZSET (queue member, score earliest work ms)
-- KEYS[6] -> shard ttl ZSET (run member, score expiry deadline ms)
-- ARGV[1] -> now (ms)
-- ARGV[2] -> variant key base (keys.Queue.VariantBase)
-- ARGV[3] -> queue member (for the master ZSET)
-- ARGV[4] -> wake channel ("" to not publish)
-- ARGV[5] -> maximum queued runs in the queue, 0 for no limit
-- ARGV[6] -> maximum queued runs in a variant, 0 for no limit
-- ARGV[7] -> run member prefix (encoded env ":" encoded queue ":")
-- ARGV[8] -> n, the number of runs (at most 1000)
-- ARGV[9+7i..15+7i] -> run i: encoded id, variant member, record, payload
--                      offset in the record, available_at (ms), ready score
--                      (ms), expiry deadline (ms, 0 for none)
-- Flag on: KEYS[7..9] and ARGV[9+7n..11+7n] follow, the scheduler's (see
-- lib/hooks_vtime).
-- Returns: one value per run: 1 queued, 0 already queued with the same
-- variant and payload (no-op), "conflict" (same id, other body),
-- "queue_full" or "key_full" (admission refused; nothing written).
--@include record
--@include hooks
--@include place
local q = { runs = KEYS[1], ck_index = KEYS[2], delay_index = KEYS[3], depth = KEYS[4],
            master = KEYS[5], qm = ARGV[3] }
local ttl_set = KEYS[6]
local now = tonumber(ARGV[1])
local vbase, wake, prefix = ARGV[2], ARGV[4], ARGV[7]
local max_queue, max_key, n = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[8])
local OWN_KEYS, OWN_ARGS = 6, 8 + 7 * n
local hooks = hooks_open(KEYS, ARGV, OWN_KEYS, OWN_ARGS, now)
-- Several runs: index entries that cannot move are not written again, and
-- the depth counts are written once at the end, unless admission reads them.
if n > 1 then q.memo = place_memo(q, max_queue == 0) end

-- Whether a run of variant v may be queued now (admission control).
local function admitted(v)
  if max_queue > 0 then
    local d = redis.call('HMGET', q.depth, 'r', 'd')
    if (tonumber(d[1]) or 0) + (tonumber(d[2]) or 0) >= max_queue then return 'queue_full' end
  end
  if max_key > 0 and redis.call('ZCARD', v.ready) + redis.call('ZCARD', v.delayed) >= max_key then
    return 'key_full'
  end
  return nil
end

local out, woke = {}, false
for i = 0, n - 1 do
  local b = 9 + 7 * i
  local id, vm, rec, at, rs, expires = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 4], ARGV[b + 5], ARGV[b + 6]
  local v = variant_keys(vbase, vm)
  if redis.call('HSETNX', q.runs, id, rec) == 0 then
    local old = redis.call('HGET', q.runs, id)
    local r = rec_parse(old)
    if r.vm == vm and string.sub(old, r.pos) == string.sub(rec, tonumber(ARGV[b + 3])) then
      out[i + 1] = 0
    else
      out[i + 1] = 'conflict'
    end
  else
    local refused = admitted(v)
    if refused then
      redis.call('HDEL', q.runs, id)
      out[i + 1] = refused
    else
      if expires ~= '0' then redis.call('ZADD', ttl_set, expires, prefix .. vm .. ':' .. id) end
      if place(q, v, hooks, id, vm, at, rs, now) then woke = true end
      out[i + 1] = 1
    end
  end
end
place_flush(q)
if woke and wake ~= '' then redis.call('PUBLISH', wake, q.qm) end
hooks.finish()
return out
