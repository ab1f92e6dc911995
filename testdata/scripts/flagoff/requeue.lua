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
-- Run metadata lives in one HASH field per run: "st|att|dl|ld|vm|pr|at|ttl".
--   st  state: r ready, d delayed, f in flight, x dead
--   att attempt number of the next (or current) delivery, from 1
--   dl  delivery counter: the lease token of the current holder
--   ld  lease deadline (ms), 0 when not in flight
--   vm  variant member ("=" + encoded concurrency key)
--   pr  priority 0..9
--   at  available_at (ms)
--   ttl expiry deadline (ms), 0 for none
local function meta_parse(s)
  local st, att, dl, ld, vm, pr, at, ttl =
    string.match(s, '^(%a)|(%d+)|(%d+)|(%d+)|([^|]*)|(%d)|(-?%d+)|(%d+)$')
  return { st = st, att = tonumber(att), dl = tonumber(dl), ld = tonumber(ld), vm = vm,
           pr = tonumber(pr), at = tonumber(at), ttl = tonumber(ttl) }
end

local function meta_format(m)
  return m.st .. '|' .. string.format('%d', m.att) .. '|' .. string.format('%d', m.dl) .. '|' ..
    string.format('%d', m.ld) .. '|' .. m.vm .. '|' .. string.format('%d', m.pr) .. '|' ..
    string.format('%d', m.at) .. '|' .. string.format('%d', m.ttl)
end

-- A number Redis returned as a string (a score). Real Redis prints scores
-- so that tonumber reads them; miniredis prints some as "1e+8", which
-- gopher-lua's tonumber refuses.
local function num(s)
  local n = tonumber(s)
  if n == nil and s then
    n = tonumber((string.gsub(string.gsub(s, 'e%+', 'e'), '^(-?%d+)e', '%1.0e')))
  end
  return n
end
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
-- Scheduler flag off: no scheduler state; the hooks do nothing. (The
-- flag-on build includes hooks_vtime instead, with the same function.)
local function hooks_open(keys, args, own_keys, own_args, now)
  local nop = function() end
  return { ready_start = nop, ready_empty = nop, released = nop, finish = nop }
end
-- Recompute the queue's score in the shard master ZSET: the earliest time it
-- has work (lowest ready head score, or earliest delayed available_at).
local function master_refresh(ck_index, delay_index, master, qm)
  local r = redis.call('ZRANGE', ck_index, 0, 0, 'WITHSCORES')
  local d = redis.call('ZRANGE', delay_index, 0, 0, 'WITHSCORES')
  local best = nil
  if r[2] then best = num(r[2]) end
  if d[2] then
    local x = num(d[2])
    if best == nil or x < best then best = x end
  end
  if best == nil then
    redis.call('ZREM', master, qm)
  else
    redis.call('ZADD', master, best, qm)
  end
end

-- Take n queued runs off the depth counter field ('r' or 'd'). When the
-- queue then holds no queued run, the counters are deleted, so a queue whose
-- last run is acked, dead-lettered or expired leaves no key behind.
local function depth_sub(depth, field, n)
  if redis.call('HINCRBY', depth, field, -n) > 0 then return end
  local other = 'd'
  if field == 'd' then other = 'r' end
  if (tonumber(redis.call('HGET', depth, other)) or 0) <= 0 then redis.call('DEL', depth) end
end

-- Put a queued run into its variant: ready (scored by ready score) when
-- available_at <= now, else delayed (scored by available_at). Maintains the
-- depth counters, ckIndex / delayIndex (LT keeps the head) and the master
-- score, which can only move when the index entry did (CH says so).
-- hooks.ready_start(vm) runs when the variant's ready head is new or
-- earlier (the scheduler registers a variant that has no tag).
-- Returns: ready (the run is ready), earliest (the run is now the queue's
-- earliest work).
local function place(q, v, hooks, id, vm, at, rs, now)
  if at <= now then
    redis.call('ZADD', v.ready, rs, id)
    redis.call('HINCRBY', q.depth, 'r', 1)
    if redis.call('ZADD', q.ck_index, 'LT', 'CH', rs, vm) == 1 then
      hooks.ready_start(vm)
      redis.call('ZADD', q.master, 'LT', rs, q.qm)
    end
    return true, false
  end
  redis.call('ZADD', v.delayed, at, id)
  redis.call('HINCRBY', q.depth, 'd', 1)
  local earliest = false
  if redis.call('ZADD', q.delay_index, 'LT', 'CH', at, vm) == 1 then
    earliest = redis.call('ZADD', q.master, 'LT', 'CH', at, q.qm) == 1
  end
  return false, earliest
end

-- place, then wake the consumers blocked on channel wake ('' for none) when
-- the run is ready, or when it is delayed and now the queue's earliest work:
-- they then sleep until its time instead of until their timeout.
local function place_wake(q, v, hooks, id, vm, at, rs, now, wake)
  local ready, earliest = place(q, v, hooks, id, vm, at, rs, now)
  if wake ~= '' and (ready or earliest) then redis.call('PUBLISH', wake, q.qm) end
  return ready
end

-- Point vm's entry in index (ckIndex or delayIndex) at the head score of
-- its set, or remove the entry when the set is empty. Returns false then.
local function index_head(set, index, vm)
  local head = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
  if head[2] then
    redis.call('ZADD', index, head[2], vm)
    return true
  end
  redis.call('ZREM', index, vm)
  return false
end

-- Remove a queued run from its variant (ready or delayed) and fix the
-- indexes. hooks.ready_empty(vm) runs when the variant's last ready run
-- leaves.
local function unplace(q, v, hooks, id, vm, st)
  if st == 'r' then
    if redis.call('ZREM', v.ready, id) == 0 then return false end
    depth_sub(q.depth, 'r', 1)
    if not index_head(v.ready, q.ck_index, vm) then hooks.ready_empty(vm) end
  else
    if redis.call('ZREM', v.delayed, id) == 0 then return false end
    depth_sub(q.depth, 'd', 1)
    index_head(v.delayed, q.delay_index, vm)
  end
  master_refresh(q.ck_index, q.delay_index, q.master, q.qm)
  return true
end
-- Load run id of variant vm and check that it is in flight under the lease
-- token the caller holds (token 0: any holder whose lease has passed now).
-- Returns the parsed metadata, or nil and an error reply.
local function load_held(meta, id, vm, token, now)
  local raw = redis.call('HGET', meta, id)
  if not raw then return nil, redis.error_reply('RQ_NOT_FOUND no such run') end
  local m = meta_parse(raw)
  if m.vm ~= vm then return nil, redis.error_reply('RQ_NOT_FOUND no such run under this concurrency key') end
  if m.st ~= 'f' then return nil, redis.error_reply('RQ_NOT_IN_FLIGHT run is not in flight') end
  if token > 0 then
    if m.dl ~= token then return nil, redis.error_reply('RQ_LEASE_LOST lease is held by a later delivery') end
  elseif m.ld > now then
    return nil, redis.error_reply('RQ_LEASE_ACTIVE lease has not expired')
  end
  return m
end
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
