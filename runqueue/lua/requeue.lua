-- requeue: a held run goes back to its variant (nack, or lease recovery
-- when its lease passed), attempt + 1, or to the dead letter when it has no
-- attempts left or the caller asks for it.
--
-- KEYS[1] -> queue runs HASH (encoded id -> record)
-- KEYS[2] -> queue ckIndex ZSET
-- KEYS[3] -> queue delayIndex ZSET
-- KEYS[4] -> queue depth HASH
-- KEYS[5] -> shard master ZSET
-- KEYS[6] -> queue held HASH ("<variant member>:<encoded id>" -> delivery token)
-- KEYS[7] -> queue key-inflight HASH (variant member -> runs in flight)
-- KEYS[8] -> env in-flight counter STRING
-- KEYS[9] -> shard leases ZSET
-- KEYS[10] -> queue dead ZSET (run member, score time of death ms)
-- KEYS[11] -> env dead HASH (queue member -> dead-lettered runs)
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
-- ARGV[12] -> variant key base (keys.Queue.VariantBase)
-- Flag on: KEYS[12..14] and ARGV[13..15] follow, the scheduler's (see
-- lib/hooks_vtime).
-- Returns: {1, attempt} requeued, {0, attempt} dead-lettered ({0, 0}: a
-- run whose record does not parse, by lease recovery or kill). A nack sent
-- again after its first call went through (the record's last settled token
-- is the holder's) returns what the first returned, and when requeued the
-- time the first set (the record's available_at) as a third value: the
-- retry's own retry time was computed later; a nack of a delivery
-- whose lease was recovered is RQ_NOT_IN_FLIGHT (or RQ_LEASE_LOST once the
-- run is delivered again).
-- Errors: RQ_NOT_FOUND (also when the run is held but its record is gone,
-- evicted: the hold is released), RQ_NOT_IN_FLIGHT, RQ_LEASE_LOST,
-- RQ_LEASE_ACTIVE, RQ_CORRUPT (a nack that would retry a run whose record
-- does not parse; nothing written).
--@include record
--@include held
--@include hooks
--@include place
local q = { runs = KEYS[1], ck_index = KEYS[2], delay_index = KEYS[3], depth = KEYS[4],
            master = KEYS[5], qm = ARGV[10] }
local held, kin, env_n, leases, dead, env_dead = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]
local now = ARGV[1] + 0 -- (client-written integers: see num in lib/record)
local id, vm, member, token, retry_at = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local priority_step, max_attempts, kill = ARGV[7] + 0, ARGV[8] + 0, ARGV[9] == '1'
local wake = ARGV[11]
local OWN_KEYS, OWN_ARGS = 11, 12
local hooks = hooks_open(KEYS, ARGV, OWN_KEYS, OWN_ARGS, now)

local _, err = held_check(q.runs, held, leases, vm, id, member, token, now)
if err == 'not_in_flight' and token ~= '0' then
  local r = rec_parse(redis.call('HGET', q.runs, id))
  if r.lt == token then
    if redis.call('ZSCORE', dead, member) then return { 0, r.att } end
    return { 1, r.att, r.at + 0 }
  end
end
-- A lease recovery (token 0) that finds a lease, passed, of a run that is
-- not held: the queue's held hash was lost (deleted by hand, evicted under
-- Config.AllowEviction) while the run was in flight, since every script
-- writes a hold and its lease together. Nothing else would ever remove
-- that lease: refused, it stayed due at the head of the shard's leases,
-- met first by every sweep (a sweep of limit n recovered nothing once n
-- such leases were due), and the run's key and env slots stayed taken for
-- ever. It is recovered as a held run is (its slots released, the run
-- requeued with attempt + 1, or released only when its record is gone
-- too). A run that is queued or dead again, or whose id is another key's
-- now (its record lost too, and the id enqueued again), is not that
-- delivery's (detached): the lease and the slots it stood for are
-- released as for a run without a record, and nothing else (every script
-- that releases a run's slots removes its lease in the same call, so a
-- lease left means its slots are still counted).
local detached = false
if token == '0' and (err == 'not_in_flight' or err == 'gone' or err == 'not_found') then
  local d = redis.call('ZSCORE', leases, member)
  if d and d + 0 <= now then
    local vk = variant_keys(ARGV[12], vm)
    detached = err == 'not_found' or err == 'not_in_flight' and (redis.call('ZSCORE', vk.ready, id)
        or redis.call('ZSCORE', vk.delayed, id) or redis.call('ZSCORE', dead, member))
    err = nil
  end
end
if err then return redis.error_reply(HELD_ERRORS[err]) end
-- The record is read before anything is written. One that does not parse
-- (a hand edit, a writer's bug) cannot be retried: a nack that would retry
-- it is refused with everything left as it was (the run held, its lease in
-- place), and a nack that dead-letters it (kill: the dequeue that served
-- it does so at once) and a lease recovery dead-letter the run with its
-- record as it is (below), where Purge can remove it and Redrive serve it
-- once it is mended. (A recovery that refused it would meet it first in
-- every sweep of its shard, its lease deadline passed, for ever.)
local rec = redis.call('HGET', q.runs, id)
local r = rec and rec_parse(rec)
if detached or r and r.att and r.vm ~= vm then
  -- (or a hold of another variant than the record's: a member added by
  -- hand to another key's ready set under a live run's id, served there,
  -- the dequeue's kill of it by its names as stored). Only the hold goes,
  -- as for a run without a record: the record is not this delivery's.
  rec, r = nil, nil
end
if r and not r.att and token ~= '0' and not kill then return redis.error_reply('RQ_CORRUPT run record does not parse') end
redis.call('HDEL', held, vm .. ':' .. id)
redis.call('ZREM', leases, member)
held_left(held, kin, kin_release(kin, { vm }, { [vm] = 1 }))
env_release(env_n, 1)
hooks:released({ vm })
if not rec then
  -- Held without a record: the runs hash was evicted (Config.AllowEviction).
  -- The run is gone; its lease and slot are released above.
  hooks:finish()
  return redis.error_reply(HELD_ERRORS.gone)
end
-- (a record that does not parse, on a lease recovery: dead-lettered as it
-- is, attempt 0)
local att = r.att and r.att + 1 or 0
-- The last settled token (lt in lib/record) is the caller's: the holder's
-- when it nacks (held_check found it held), 0 for a lease recovery, so
-- that neither the holder's nack, sent late, nor a retry of a nack that
-- settled an earlier stay is taken for a retry of a nack that settled this
-- one.
if not r.att or kill or (max_attempts > 0 and att > max_attempts) then
  if r.att then redis.call('HSET', q.runs, id, rec_with(rec, r, att, r.at, token)) end
  redis.call('ZADD', dead, now, member)
  redis.call('HINCRBY', env_dead, q.qm, '1')
  hooks:finish()
  return { 0, att }
end
redis.call('HSET', q.runs, id, rec_with(rec, r, att, retry_at, token))
local v = variant_keys(ARGV[12], vm)
if place(q, v, hooks, id, vm, retry_at, retry_at - r.pr * priority_step, now) and wake ~= '' then
  redis.call('PUBLISH', wake, q.qm)
end
hooks:finish()
return { 1, att }
