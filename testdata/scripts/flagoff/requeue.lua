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
-- A run's record is one field of the queue's runs HASH, built by Go
-- (runqueue/record.go): "ttl|att|pr|at|lt|vm|" then the payload's bytes.
--   ttl  expiry deadline (ms), 0 for none: first, so that one byte tells
--        whether the run has one (rec_has_ttl). It binds only until the
--        first delivery: the dequeue removes the run's ttl entry but does
--        not rewrite the record; every later rewrite (rec_with) clears it.
--   att  attempt number of the next (or current) delivery, from 1
--   pr   priority 0..9
--   at   available_at (ms)
--   lt   delivery token of the delivery whose nack settled the run's
--        current stay (0: none; a lease recovery and a redrive write 0): a
--        retried nack finds its answer there
--   vm   variant member ("=" + encoded concurrency key)
-- A run's state is where it is: a variant's ready or delayed set, the
-- queue's held hash (in flight), or the queue's dead set. The fields stay
-- strings unless a script computes with them; the dequeue does not parse
-- records at all.
local function rec_parse(s)
  local ttl, att, pr, at, lt, vm, pos = string.match(s, '^(%d+)|(%d+)|(%d)|(%d+)|(%d+)|([^|]*)|()')
  return { att = tonumber(att), pr = tonumber(pr), at = at, ttl = ttl, lt = lt, vm = vm, pos = pos }
end

-- The record r after a delivery (nack, lease recovery, redrive): new att,
-- at and lt, no TTL, and the same pr, vm and payload.
local function rec_with(s, r, att, at, lt)
  return '0|' .. att .. '|' .. r.pr .. '|' .. at .. '|' .. lt .. '|' .. r.vm .. '|' .. string.sub(s, r.pos)
end


-- Number x as a command argument: the string Redis makes of a Lua number
-- argument of redis.call ('%.17g'), made faster. '%.17g' takes a slow path
-- of the C library (about 0.5 us on Redis 7.0); for an integer below 2^53
-- in magnitude '%d' prints the same digits for a third of that (and -0 as
-- "0"). Anything else (a fraction, a huge value from a hand-edited key)
-- keeps '%.17g'. 0 and 1, the counts and ranks a call passes most, are
-- not formatted at all.
local function num_arg(x)
  if x == 0 then return '0' elseif x == 1 then return '1' end
  if x % 1 == 0 and x > -9007199254740992 and x < 9007199254740992 then return string.format('%d', x) end
  return string.format('%.17g', x)
end

-- A number Redis returned as a string (a score), or nil for a missing one
-- (false or nil). Arithmetic reads the string once; tonumber reads it twice
-- on Redis 7.0's Lua (about 1,400 instructions against 500), and a score
-- is read for every variant a dequeue looks at. Every score Redis prints
-- reads so (digits, "inf", "-inf"), and so does every score miniredis
-- prints ("1e+08") in gopher-lua, whose arithmetic parses it as a float.
-- The scripts read the integers the client writes in their arguments
-- (decimal, no leading zero: gopher-lua reads "010" + 0 as octal) the same
-- way, x + 0; tonumber stays where a value may be missing or not a number.
local function num(s)
  if not s then return nil end
  return s + 0
end
-- In-flight runs. The queue's held HASH maps "<variant member>:<encoded
-- id>" to the delivery token of its holder (the queue's in-flight count is
-- its length); the queue's key-inflight HASH counts in-flight runs per
-- variant member (fields go at 0); the env's counter STRING counts them
-- across the env's queues; the shard's leases ZSET holds each run member
-- (run prefix .. field) with its lease deadline.
--
-- The wide marks (layout 5): Redis keeps a HASH of at most 512 fields
-- (hash-max-listpack-entries) whose values are all at most 64 bytes as a
-- listpack, which every lookup, insert and delete walks from its start; at
-- a few hundred runs in flight the held and key-inflight hashes cost a
-- dequeue and an ack more than the hash table would (callgrind on Redis
-- 7.0.15: a worker loop at 100 runs in flight over 100 keys spent about a
-- tenth of its instructions walking them). A dequeue that takes the
-- shard's token counter past a multiple of 64 while its env has 64 runs or
-- more in flight looks at the queue's held hash, and when it holds 64
-- fields or more gives it the field "~" with a value of more than 64 bytes
-- (and the key-inflight hash too, when it holds 64 or more), which turns it
-- into a hash table for the rest of its lifetime. No held field ("<variant
-- member>:<id>") and no variant member ("=" ...) is "~". The queue's
-- in-flight count is the held hash's length less its mark (held_count);
-- when the last run in flight leaves a marked held hash, both hashes go
-- (held_left), so an empty queue leaves no key behind.



-- Runs left flight (their held fields are gone) and zeroed, the count of
-- some variant reached 0 (kin_release says): when a marked held hash holds
-- only its mark, both hashes go (every count of kin is 0 then: only its
-- mark, if any, is left). The last run of the queue to leave flight is the
-- last of its variant too, so a call in which no count reached 0 cannot
-- have emptied the queue and reads nothing. (An HLEN costs an ack less than
-- reading the mark with the holders: its value is long.)
local function held_left(held, kin, zeroed)
  if not zeroed then return end
  if redis.call('HLEN', held) == 1 and redis.call('HEXISTS', held, '~') == 1 then
    redis.call('DEL', held, kin)
  end
end

-- Check that run id of variant vm (held field vm:id, run member member)
-- is in flight under token (token "0": any holder whose lease has passed
-- now). Returns the holder's token, or nil and an error code: gone (no such
-- run at all: done already, or never queued), not_found (the run exists
-- under another key), not_in_flight, lease_lost, lease_active.
-- Why run id of variant vm is not held: gone, not_in_flight or not_found.
local function held_missing(runs, vm, id)
  local rec = redis.call('HGET', runs, id)
  if not rec then return 'gone' end
  if rec_parse(rec).vm == vm then return 'not_in_flight' end
  return 'not_found'
end

local function held_check(runs, held, leases, vm, id, member, token, now)
  local t = redis.call('HGET', held, vm .. ':' .. id)
  if not t then return nil, held_missing(runs, vm, id) end
  if token ~= '0' then
    if t ~= token then return nil, 'lease_lost' end
  else
    local deadline = num(redis.call('ZSCORE', leases, member))
    if deadline and deadline > now then return nil, 'lease_active' end
  end
  return t
end

-- Runs of the variants vms leave flight, per_vm[vm] of each (their held
-- fields and leases gone by the caller): the counts follow, in one read and
-- at most two writes. Returns whether the count of some variant reached 0.
local function kin_release(kin, vms, per_vm)
  if #vms == 1 then
    -- One variant: subtract (one command while runs are left in flight).
    if redis.call('HINCRBY', kin, vms[1], num_arg(-per_vm[vms[1]])) > 0 then return false end
    redis.call('HDEL', kin, vms[1])
    return true
  end
  local ns = redis.call('HMGET', kin, unpack(vms))
  local set, del = {}, {}
  for i, vm in ipairs(vms) do
    local left = (tonumber(ns[i]) or 0) - per_vm[vm]
    if left > 0 then
      set[#set + 1] = vm
      set[#set + 1] = num_arg(left)
    else
      del[#del + 1] = vm
    end
  end
  if #set > 0 then redis.call('HSET', kin, unpack(set)) end
  if #del > 0 then redis.call('HDEL', kin, unpack(del)) end
  return #del > 0
end

-- n runs of the env leave flight.
local function env_release(env_n, n)
  if redis.call('DECRBY', env_n, num_arg(n)) <= 0 then redis.call('DEL', env_n) end
end

local HELD_ERRORS = {
  gone = 'RQ_NOT_FOUND no such run',
  not_found = 'RQ_NOT_FOUND no such run',
  not_in_flight = 'RQ_NOT_IN_FLIGHT run is not in flight',
  lease_lost = 'RQ_LEASE_LOST lease is held by a later delivery',
  lease_active = 'RQ_LEASE_ACTIVE lease has not expired',
}

-- Scheduler flag off: no scheduler state; the hooks do nothing. (The
-- flag-on build includes hooks_vtime instead, with the same function.)
local function hooks_open(keys, args, own_keys, own_args, now)
  local nop = function() end
  return { ready_start = nop, ready_empty = nop, released = nop, finish = nop }
end
-- Wide sets. Redis keeps a sorted set of at most 128 members
-- (zset-max-listpack-entries) of at most 64 bytes each as a listpack, which
-- a ZADD walks from its start to find the member and again to find its
-- place; a queue's ckIndex of 64 to 128 keys and a variant's ready set of
-- 64 to 128 runs cost every write there more than a skiplist would
-- (callgrind on Redis 7.0.15, 100 keys: a dequeue at batch 10 spent 15% of
-- its instructions in ckIndex's walks, a bulk enqueue of 100 runs per key
-- about a third in the ready sets', a worker's fused ack-and-dequeue with
-- 100 runs in flight 13-17% in the leases'). widen gives such a set a
-- member of more than 64 bytes and removes it again in the same script:
-- Redis turns the set into a skiplist at the ZADD and keeps it one after
-- the ZREM (it turns a skiplist back into a listpack only when it writes a
-- new set: ZRANGESTORE, ZUNIONSTORE, loading a dump), so no reader sees the
-- member and the stored data is what it was. (ZADD NX: a member of that
-- name, which no index or set holds, would be left alone.) The sets looked
-- at: a variant's ready or delayed set and the index of its kind (ckIndex,
-- delayIndex) when a call places runs there and takes the queue's depth
-- count of that kind past a multiple of 64 (place_count, place_flush);
-- ckIndex and the shard's leases (its runs in flight) when a dequeue takes
-- the shard's token counter past one. The queue's runs hash too, at both
-- (widen: the same for a hash).

-- Look at sorted sets zs (a list) and hash h (nil: none): make each set
-- of WIDE.AT to WIDE.TO members a skiplist (above that Redis has made it
-- one, at its default configuration), and h a hash table when it holds
-- WIDE.AT to WIDE.HASH_TO fields. (Redis keeps a hash of at most 512
-- fields, hash-max-listpack-entries, of at most 64 bytes each as a
-- listpack, as a queue's runs hash is with payloads under about 25 bytes;
-- a field of more than 64 bytes, set and deleted again, turns it into a
-- hash table for good.) One function for both: a script makes a closure
-- of each function it defines at every call.
local function widen(zs, h)
  for _, z in ipairs(zs) do
    local n = redis.call('ZCARD', z)
    if n >= 64 and n <= 128 and redis.call('ZADD', z, 'NX', '0', '~runqueue: a name of more than 64 bytes turns a listpack into a skiplist or hash table') == 1 then
      redis.call('ZREM', z, '~runqueue: a name of more than 64 bytes turns a listpack into a skiplist or hash table')
    end
  end
  if h then
    local n = redis.call('HLEN', h)
    if n >= 64 and n <= 512 and redis.call('HSETNX', h, '~runqueue: a name of more than 64 bytes turns a listpack into a skiplist or hash table', '1') == 1 then
      redis.call('HDEL', h, '~runqueue: a name of more than 64 bytes turns a listpack into a skiplist or hash table')
    end
  end
end

-- The queue's depth count of field ('r' ready, 'd' delayed) went up by k
-- to n: when it passed a multiple of WIDE.AT, widen the sets of that kind
-- the call placed runs in, the index of that kind and the runs hash. set
-- is the one set the call placed runs in, or a counting memo (see
-- place_memo): then the sets it placed WIDE.EACH runs or more in, else its
-- last run's, so that a call of runs of many keys reads a few sets, not one
-- per key (a ZCARD is a small part of WIDE.EACH runs' cost).
local function place_widen(q, field, n, k, set)
  if k < 64 and n % 64 >= k then return end
  local sets = {}
  if type(set) == 'string' then
    sets[1] = set
  else
    local memo = set
    for _, z in ipairs(memo.sets[field]) do
      local runs = memo.args and #memo.args[z] / 2 or memo.seen[z]
      if runs >= 4 then sets[#sets + 1] = z end
    end
    if #sets == 0 then sets[1] = memo.last[field] end
  end
  if field == 'r' then sets[#sets + 1] = q.ck_index else sets[#sets + 1] = q.delay_index end
  widen(sets, q.runs)
end



-- The keys of variant vm of the queue whose variant keys start with vbase
-- (keys.Queue.VariantBase): the names keys.Queue.Variant builds in Go, in
-- the queue's hash slot.
local function variant_keys(vbase, vm)
  local b = vbase .. string.sub(vm, 2)
  return { ready = b .. ':ready', delayed = b .. ':delayed' }
end

-- q.memo, when set (a call that places many runs), saves commands that
-- cannot change anything: memo.low[index][vm] is the lowest score this call
-- gave vm's entry in index (ckIndex or delayIndex), at or above its score
-- since (LT), so a later run of vm at or above it leaves the entry as it is
-- (the ZADD LT CH would answer 0); with memo.count the depth counts add up
-- in memo.r and memo.d for the caller to write once (place_flush), and
-- memo.sets.r and memo.sets.d list the ready and delayed sets the call
-- placed runs in, each once (memo.seen[set]: its runs; a bulk call gives
-- memo.args[set], the set's ZADD arguments, two a run, instead), and
-- memo.last.r and memo.last.d are the last of each, for place_flush to
-- widen.

-- Count a run placed in set in the depth field ('r' or 'd').
local function place_count(q, field, set)
  local memo = q.memo
  if memo and memo.count then
    memo[field] = memo[field] + 1
    memo.last[field] = set
    local c = memo.seen[set]
    if c then
      memo.seen[set] = c + 1
    else
      memo.seen[set] = 1
      local sets = memo.sets[field]
      sets[#sets + 1] = set
    end
  else
    place_widen(q, field, redis.call('HINCRBY', q.depth, field, '1'), 1, set)
  end
end

-- Whether vm's entry in index may move to score s (not when the memo knows
-- a score at or below s); notes s.
local function place_moves(q, index, vm, s)
  local memo = q.memo
  if not memo then return true end
  local low = memo.low[index]
  local was = low[vm]
  local x = s + 0
  if was and x >= was then return false end
  low[vm] = x
  return true
end

-- Whether delayed work due at `at` (k variants' delay-index entries, nil:
-- 1, just moved there; the master score did not move: the queue holds due
-- work, or delayed work due no later) is the queue's first delayed work
-- due after now, with no other due at or before at. A consumer that waits
-- beside due work that limits hold back looks early at the first such
-- time it read when it went to sleep (queueNext in runqueue/wake.go), so
-- it is told of an earlier one: without it, a free key's retry due in
-- 100 ms waited out the poll (Config.BlockPollInterval) beside a key at its
-- limit. Work due at the time of other delayed work is not told
-- (helper-193: runs of new keys all due at one time published at each
-- write). One ZCOUNT, in the calls that move an entry of the delay index
-- and not the master score, unless the call (q.memo.woke) already woke
-- consumers or tells none (q.nowake: repair).
local function place_soonest(q, at, now, k)
  local memo = q.memo
  if q.nowake or memo and memo.woke then return false end
  return redis.call('ZCOUNT', q.delay_index, string.format('(%d', now), at) <= (k or 1)
end

-- Put a queued run into its variant: ready (scored by ready score rs) when
-- available_at <= now, else delayed (scored by available_at). at and rs
-- are numbers or decimal strings. Maintains the depth counters, ckIndex /
-- delayIndex (LT keeps the head) and the master score, which can only move
-- when the index entry did (CH says so). hooks:ready_start(vm) runs when
-- the variant's ready head is new or earlier (the scheduler registers a
-- variant that has no tag).
-- Returns: whether the run is ready (its variant's head), the queue's
-- earliest work, or its first delayed work due after now (place_soonest):
-- a blocked consumer should look again.
local function place(q, v, hooks, id, vm, at, rs, now)
  local woke = false
  if at + 0 <= now then
    redis.call('ZADD', v.ready, rs, id)
    if place_moves(q, q.ck_index, vm, rs) and redis.call('ZADD', q.ck_index, 'LT', 'CH', rs, vm) == 1 then
      hooks:ready_start(vm)
      redis.call('ZADD', q.master, 'LT', rs, q.qm)
      woke = true
    end
    place_count(q, 'r', v.ready)
  else
    redis.call('ZADD', v.delayed, at, id)
    if place_moves(q, q.delay_index, vm, at) and redis.call('ZADD', q.delay_index, 'LT', 'CH', at, vm) == 1 then
      woke = redis.call('ZADD', q.master, 'LT', 'CH', at, q.qm) == 1 or place_soonest(q, at, now)
    end
    place_count(q, 'd', v.delayed)
  end
  if woke and q.memo then q.memo.woke = true end
  return woke
end




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
