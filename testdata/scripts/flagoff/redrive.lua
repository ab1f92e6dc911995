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
