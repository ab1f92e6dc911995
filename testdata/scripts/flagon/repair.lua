-- repair: rebuild what one queue's scripts keep beside its runs from the
-- runs themselves, after a key was lost (deleted by hand, or evicted
-- under AllowEviction). Queue.Repair reads the queue's records and held
-- runs and calls this once per part; each call is atomic and may be sent
-- again (it writes only what is missing or wrong, and a second send finds
-- nothing to write). The scheduler has no part in it: a ready variant
-- without a registration is found by the flag-on dequeue's discovery, as
-- work a flag-off instance wrote is, so it is the same script on both
-- flags.
--
-- ARGV[1] -> the part: "runs", "index", "kin" or "leases"
--
-- "runs": each run Repair read. A queued run with a deadline gets its
-- TTL sweep entry when it has none. Runs whose record is there but that
-- are in none of the sets
-- a run is always in (its variant's ready or delayed set, the queue's
-- held hash, its dead set) and have no lease: their set was lost. Each is
-- queued again as its record says (ready at its available_at, by its
-- priority; delayed when that is later than now), or dead-lettered now
-- when asked or when its attempts are past the maximum (only a run
-- dead-lettered for its attempts has such a record), or deleted as the
-- TTL sweep would when its TTL passed and its TTL entry is there (it was
-- never delivered). A run with a lease but no hold (the held hash lost)
-- is left to lease recovery, which requeues it once the lease passes (its
-- holder may still be running it). A record that does not parse, or whose
-- variant member is not one runqueue writes, is left as it is.
-- KEYS[1] -> queue runs HASH (encoded id -> record)
-- KEYS[2] -> queue ckIndex ZSET
-- KEYS[3] -> queue delayIndex ZSET
-- KEYS[4] -> queue depth HASH
-- KEYS[5] -> shard master ZSET
-- KEYS[6] -> queue held HASH
-- KEYS[7] -> queue dead ZSET (run member, score time of death ms)
-- KEYS[8] -> env dead HASH (queue member -> dead-lettered runs)
-- KEYS[9] -> shard leases ZSET (run member, score lease deadline ms)
-- KEYS[10] -> shard ttl ZSET (run member, score expiry deadline ms)
-- ARGV[2] -> variant key base
-- ARGV[3] -> queue member
-- ARGV[4] -> run member prefix
-- ARGV[5] -> now (ms)
-- ARGV[6] -> priority step (ms)
-- ARGV[7] -> 1 to dead-letter the runs found, 0 to queue them again
-- ARGV[8] -> max attempts, 0 for no limit
-- ARGV[9..] -> encoded ids of runs Repair read
-- Returns: {runs found in no set, of them dead-lettered, of them expired,
-- TTL entries added (a run gone, in flight, dead, of no deadline or with
-- its entry there gets none; a run found in no set and queued again gets
-- one when it has a deadline)}.
--
-- "index": the age and delay indexes, the depth counts and the queue's
-- entry in the shard master, from the variants' sets; the queue's count
-- of dead runs in the env's, from its dead set. An index member that is
-- not a variant member runqueue writes ("=" and an encoded key) is
-- removed; nothing else of it is read.
-- KEYS[1] -> queue ckIndex ZSET (variant member, score head ready score ms)
-- KEYS[2] -> queue delayIndex ZSET (variant member, score earliest available_at ms)
-- KEYS[3] -> queue depth HASH (r: ready count, d: delayed count)
-- KEYS[4] -> shard master ZSET (queue member, score earliest work ms)
-- KEYS[5] -> queue dead ZSET
-- KEYS[6] -> env dead HASH (queue member -> dead-lettered runs)
-- ARGV[2] -> variant key base (keys.Queue.VariantBase)
-- ARGV[3] -> queue member
-- ARGV[4..] -> variant members whose runs Repair read; the variants both
--            indexes name are looked at too (a variant that got its
--            first run since the read has an entry: every run placed
--            writes one)
-- Returns: {variants looked at, index entries added, moved or removed,
-- 1 when the depth counts were rewritten else 0, 1 when the master entry
-- was added, moved or removed else 0, 1 when the dead count was
-- rewritten else 0}.
--
-- "kin": the queue's counts of runs in flight per key: its held runs,
-- and its leases whose hold is gone (the held hash lost), since lease
-- recovery releases the slots of those too.
-- KEYS[1] -> queue held HASH ("<variant member>:<encoded id>" -> token)
-- KEYS[2] -> queue key-inflight HASH (variant member -> runs in flight)
-- KEYS[3] -> shard leases ZSET
-- ARGV[2] -> run member prefix
-- ARGV[3..] -> the queue's lease members Repair read
-- Returns: the number of keys whose count was set, added or removed.
--
-- "leases": the leases of runs in flight, deadline given.
-- KEYS[1] -> queue held HASH ("<variant member>:<encoded id>" -> token)
-- KEYS[2] -> shard leases ZSET (run member, score lease deadline ms)
-- ARGV[2] -> the lease deadline of a lease added (ms)
-- ARGV[3] -> run member prefix
-- ARGV[4..] -> held fields Repair read
-- Returns: the number of leases added (a run no longer held, or whose
-- lease is there, gets none: a lease stands for a hold and its slots, and
-- lease recovery releases them, so none is added for a run that left).
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

-- Recompute the queue's score in the shard master ZSET: the earliest time it
-- has work (lowest ready head score, or earliest delayed available_at).
-- dhead and chead are delayIndex's and ckIndex's lowest scores when the
-- caller knows them (false: the index is empty), nil to read them.
local function master_refresh(ck_index, delay_index, master, qm, dhead, chead)
  if chead == nil then
    local r = redis.call('ZRANGE', ck_index, '0', '0', 'WITHSCORES')
    chead = r[2] and num(r[2]) or false
  end
  if dhead == nil then
    local d = redis.call('ZRANGE', delay_index, '0', '0', 'WITHSCORES')
    dhead = d[2] and num(d[2]) or false
  end
  local best = chead or nil
  if dhead and (best == nil or dhead < best) then best = dhead end
  if best == nil then
    redis.call('ZREM', master, qm)
  else
    redis.call('ZADD', master, best, qm)
  end
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








local HELD_ERRORS = {
  gone = 'RQ_NOT_FOUND no such run',
  not_found = 'RQ_NOT_FOUND no such run',
  not_in_flight = 'RQ_NOT_IN_FLIGHT run is not in flight',
  lease_lost = 'RQ_LEASE_LOST lease is held by a later delivery',
  lease_active = 'RQ_LEASE_ACTIVE lease has not expired',
}

local part = ARGV[1]

-- Whether a score as Redis replied it (false: none) differs from want (a
-- score as replied, or a number). (num, not tonumber: miniredis prints
-- 2e+12, which gopher-lua's tonumber does not read.)
local function differs(have, want)
  return not have or num(have) ~= num(want)
end

-- Whether vm is a variant member as runqueue writes them: "=" and an
-- encoded key (keys.Segment). Another string names the sets of some key
-- all the same (variant_keys drops its first byte): one with another first
-- byte would count that key's runs twice.
local function runqueue_vm(vm)
  return string.match(vm, '^=[%w._%%-]*$') ~= nil
end

if part == 'runs' then
  local q = { runs = KEYS[1], ck_index = KEYS[2], delay_index = KEYS[3], depth = KEYS[4],
              master = KEYS[5], qm = ARGV[3], nowake = true } -- (repair publishes nothing: see place_soonest)
  local held, dead, env_dead, leases, ttl_set = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
  local vbase, prefix, now, step, kill = ARGV[2], ARGV[4], ARGV[5] + 0, ARGV[6] + 0, ARGV[7] == '1'
  local max_attempts = ARGV[8] + 0
  local nohooks = { ready_start = function() end }
  local found, killed, expired, ttl_added = 0, 0, 0, 0
  -- A queued run with a deadline: its TTL entry when it has none.
  local function ttl_entry(r, member)
    if r.ttl ~= '0' and not redis.call('ZSCORE', ttl_set, member) then
      redis.call('ZADD', ttl_set, r.ttl, member)
      ttl_added = ttl_added + 1
    end
  end
  for i = 9, #ARGV do
    local id = ARGV[i]
    local rec = redis.call('HGET', q.runs, id)
    local r = rec and rec_parse(rec)
    if r and r.att and runqueue_vm(r.vm) then
      local v = variant_keys(vbase, r.vm)
      local member = prefix .. r.vm .. ':' .. id
      if redis.call('ZSCORE', v.ready, id) or redis.call('ZSCORE', v.delayed, id) then
        ttl_entry(r, member)
      elseif not (redis.call('HEXISTS', held, r.vm .. ':' .. id) == 1 or redis.call('ZSCORE', dead, member)
          or redis.call('ZSCORE', leases, member)) then
        found = found + 1
        local entry = r.ttl ~= '0' and redis.call('ZSCORE', ttl_set, member)
        if entry and tonumber(r.ttl) <= now then
          -- (a run keeps its record's deadline through its first delivery,
          -- but its TTL entry goes at the dequeue: with the entry, it was
          -- never delivered, and its TTL binds)
          redis.call('HDEL', q.runs, id)
          redis.call('ZREM', ttl_set, member)
          expired = expired + 1
        elseif kill or (max_attempts > 0 and r.att > max_attempts) then
          -- (dead-lettered as requeue does: the record's deadline cleared)
          if r.ttl ~= '0' then
            redis.call('HSET', q.runs, id, rec_with(rec, r, r.att, r.at, r.lt))
            redis.call('ZREM', ttl_set, member)
          end
          redis.call('ZADD', dead, now, member)
          redis.call('HINCRBY', env_dead, q.qm, '1')
          killed = killed + 1
        else
          if r.ttl ~= '0' and not entry then
            -- (no TTL entry: delivered once, its hold and lease lost; its
            -- TTL binds no more, and its deadline goes as a redelivery's
            -- rewrite clears it, or the dequeue would expire it)
            redis.call('HSET', q.runs, id, rec_with(rec, r, r.att, r.at, r.lt))
          end
          place(q, v, nohooks, id, r.vm, r.at, r.at - r.pr * step, now)
        end
      end
    end
  end
  return { found, killed, expired, ttl_added }
end

if part == 'index' then
  local ck_index, delay_index, depth, master = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  local vbase, qm = ARGV[2], ARGV[3]
  local vms, seen = {}, {}
  local function add(vm)
    if not seen[vm] and runqueue_vm(vm) then
      seen[vm] = true
      vms[#vms + 1] = vm
    end
  end
  for i = 4, #ARGV do add(ARGV[i]) end
  local fixed, counts = 0, { r = 0, d = 0 }
  -- Each index as it is (member -> score), read once; a member runqueue
  -- does not write goes.
  local function read(index)
    local have, z = {}, redis.call('ZRANGE', index, '0', '-1', 'WITHSCORES')
    for i = 1, #z, 2 do
      if runqueue_vm(z[i]) then
        have[z[i]] = z[i + 1]
        add(z[i])
      else
        redis.call('ZREM', index, z[i])
        fixed = fixed + 1
      end
    end
    return have
  end
  local ck_have, delay_have = read(ck_index), read(delay_index)
  -- Point vm's entry in index (its entry's score have, or nil) at the head
  -- of set, or remove it when the set is empty; count the set's runs in
  -- field.
  local function mend(set, index, have, vm, field)
    local head = redis.call('ZRANGE', set, '0', '0', 'WITHSCORES')
    if head[2] then
      counts[field] = counts[field] + redis.call('ZCARD', set)
      if differs(have, head[2]) then
        redis.call('ZADD', index, head[2], vm)
        fixed = fixed + 1
      end
    elseif have then
      redis.call('ZREM', index, vm)
      fixed = fixed + 1
    end
  end
  for _, vm in ipairs(vms) do
    local v = variant_keys(vbase, vm)
    mend(v.ready, ck_index, ck_have[vm], vm, 'r')
    mend(v.delayed, delay_index, delay_have[vm], vm, 'd')
  end
  local d = redis.call('HMGET', depth, 'r', 'd')
  local depth_fixed = 0
  if (tonumber(d[1]) or 0) ~= counts.r or (tonumber(d[2]) or 0) ~= counts.d then
    depth_fixed = 1
    redis.call('DEL', depth)
    if counts.r + counts.d > 0 then
      redis.call('HSET', depth, 'r', num_arg(counts.r), 'd', num_arg(counts.d))
    end
  end
  -- The queue's master score: its earliest work, written by master_refresh
  -- only when it differs, so that a queue with nothing to mend is only
  -- read, even on a Redis at maxmemory.
  local function head(index)
    local h = redis.call('ZRANGE', index, '0', '0', 'WITHSCORES')
    return h[2] and num(h[2]) or false
  end
  local chead, dhead = head(ck_index), head(delay_index)
  local best = chead
  if dhead and (not best or dhead < best) then best = dhead end
  local was = redis.call('ZSCORE', master, qm)
  local master_fixed = 0
  if (best and differs(was, best)) or (not best and was) then
    master_refresh(ck_index, delay_index, master, qm, dhead, chead)
    master_fixed = 1
  end
  if fixed > 0 then widen({ ck_index, delay_index }, nil) end
  local dead_n = redis.call('ZCARD', KEYS[5])
  local dead_fixed = 0
  if (tonumber(redis.call('HGET', KEYS[6], qm)) or 0) ~= dead_n then
    dead_fixed = 1
    if dead_n > 0 then redis.call('HSET', KEYS[6], qm, dead_n) else redis.call('HDEL', KEYS[6], qm) end
  end
  return { #vms, fixed, depth_fixed, master_fixed, dead_fixed }
end

if part == 'kin' then
  local held, kin, leases, prefix = KEYS[1], KEYS[2], KEYS[3], ARGV[2]
  local want, vms = {}, {}
  -- (a held field is "<variant member>:<encoded id>"; neither holds ':'
  -- as runqueue writes them, an id added by hand may)
  local function count(field)
    local vm = string.match(field, '^([^:]*):')
    if vm then
      if not want[vm] then
        want[vm] = 0
        vms[#vms + 1] = vm
      end
      want[vm] = want[vm] + 1
    end
  end
  for _, field in ipairs(redis.call('HKEYS', held)) do
    if field ~= '~' then count(field) end
  end
  for i = 3, #ARGV do
    local field = string.sub(ARGV[i], #prefix + 1)
    if redis.call('HEXISTS', held, field) == 0 and redis.call('ZSCORE', leases, ARGV[i]) then count(field) end
  end
  local fixed, have = 0, {}
  local kv = redis.call('HGETALL', kin)
  for i = 1, #kv, 2 do
    if kv[i] ~= '~' then
      have[kv[i]] = kv[i + 1]
      if not want[kv[i]] then
        redis.call('HDEL', kin, kv[i])
        fixed = fixed + 1
      end
    end
  end
  for _, vm in ipairs(vms) do
    if tonumber(have[vm]) ~= want[vm] then
      redis.call('HSET', kin, vm, num_arg(want[vm]))
      fixed = fixed + 1
    end
  end
  return fixed
end

if part == 'leases' then
  local held, leases = KEYS[1], KEYS[2]
  local deadline, prefix = ARGV[2], ARGV[3]
  local added = 0
  for i = 4, #ARGV do
    local field = ARGV[i]
    local member = prefix .. field
    if field ~= '~' and redis.call('HEXISTS', held, field) == 1
        and not redis.call('ZSCORE', leases, member) then
      redis.call('ZADD', leases, deadline, member)
      added = added + 1
    end
  end
  return added
end

return redis.error_reply('runqueue: repair: unknown part ' .. tostring(part))
