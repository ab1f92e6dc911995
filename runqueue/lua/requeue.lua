-- requeue: a held run goes back to its variant (nack, or lease recovery
-- when its lease passed), attempt + 1, or to the dead letter when it has no
-- attempts left or the caller asks for it.
--
-- KEYS[1] -> queue meta HASH
-- KEYS[2] -> variant ready ZSET
-- KEYS[3] -> variant delayed ZSET
-- KEYS[4] -> queue ckIndex ZSET
-- KEYS[5] -> queue delayIndex ZSET
-- KEYS[6] -> queue depth HASH
-- KEYS[7] -> shard master ZSET
-- KEYS[8] -> env inflight SET
-- KEYS[9] -> queue inflight SET
-- KEYS[10] -> variant inflight SET
-- KEYS[11] -> shard leases ZSET
-- KEYS[12] -> queue dead ZSET (run member, score time of death ms)
-- KEYS[13] -> env dead HASH (queue member -> dead-lettered runs)
-- ARGV[1] -> now (ms)
-- ARGV[2] -> encoded message id
-- ARGV[3] -> variant member
-- ARGV[4] -> run member
-- ARGV[5] -> delivery token of the holder; 0 to recover an expired lease
-- ARGV[6] -> retry at (ms)
-- ARGV[7] -> priority step (ms)
-- ARGV[8] -> max attempts, 0 for no limit
-- ARGV[9] -> 1 to dead-letter now
-- ARGV[10] -> queue member
-- ARGV[11] -> wake channel ("" to not publish)
-- Flag on: KEYS[14..16] and ARGV[12..14] follow, the scheduler's (see
-- lib/hooks_vtime).
-- Returns: {1, attempt} requeued, {0, attempt} dead-lettered. A retried
-- call of a holder whose first call went through (the run is no longer in
-- flight and its last delivery token is the holder's) returns what the
-- first returned.
-- Errors: RQ_NOT_FOUND, RQ_NOT_IN_FLIGHT, RQ_LEASE_LOST, RQ_LEASE_ACTIVE.
--@include meta
local q = { meta = KEYS[1], ck_index = KEYS[4], delay_index = KEYS[5], depth = KEYS[6],
            master = KEYS[7], qm = ARGV[10] }
local v = { ready = KEYS[2], delayed = KEYS[3] }
local env_inflight, queue_inflight, variant_inflight, leases, dead, env_dead =
  KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13]
local now = tonumber(ARGV[1])
local id, vm, member = ARGV[2], ARGV[3], ARGV[4]
local token = tonumber(ARGV[5])
local retry_at = tonumber(ARGV[6])
local priority_step = tonumber(ARGV[7])
local max_attempts = tonumber(ARGV[8])
local kill = ARGV[9] == '1'
local wake = ARGV[11]
--@include hooks
--@include place
--@include holder
local OWN_KEYS, OWN_ARGS = 13, 11
local hooks = hooks_open(KEYS, ARGV, OWN_KEYS, OWN_ARGS, now)

if token > 0 then
  local raw = redis.call('HGET', q.meta, id)
  if raw then
    local m = meta_parse(raw)
    if m.vm == vm and m.st ~= 'f' and m.dl == token then
      if m.st == 'x' then return { 0, m.att } end
      return { 1, m.att }
    end
  end
end
local m, err = load_held(q.meta, id, vm, token, now)
if err then return err end
redis.call('SREM', env_inflight, member)
redis.call('SREM', queue_inflight, id)
redis.call('SREM', variant_inflight, id)
redis.call('ZREM', leases, member)
hooks.released(vm)
m.att = m.att + 1
m.ld = 0
if kill or (max_attempts > 0 and m.att > max_attempts) then
  m.st = 'x'
  redis.call('HSET', q.meta, id, meta_format(m))
  redis.call('ZADD', dead, now, member)
  redis.call('HINCRBY', env_dead, q.qm, 1)
  hooks.finish()
  return { 0, m.att }
end
m.at = retry_at
m.st = 'd'
if retry_at <= now then m.st = 'r' end
redis.call('HSET', q.meta, id, meta_format(m))
place_wake(q, v, hooks, id, vm, retry_at, retry_at - m.pr * priority_step, now, wake)
hooks.finish()
return { 1, m.att }
