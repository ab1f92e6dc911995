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

-- A memo for place (see there) of the queue q; count: add up the depth
-- counts.
local function place_memo(q, count)
  return { count = count, r = 0, d = 0, low = { [q.ck_index] = {}, [q.delay_index] = {} },
           sets = { r = {}, d = {} }, seen = {}, last = {} }
end

-- Write the depth counts a counting memo added up (and widen, see WIDE:
-- the sets place_widen picks of those the call placed runs in).
local function place_flush(q)
  local memo = q.memo
  if not (memo and memo.count) then return end
  if memo.r > 0 then
    place_widen(q, 'r', redis.call('HINCRBY', q.depth, 'r', num_arg(memo.r)), memo.r, memo)
  end
  if memo.d > 0 then
    place_widen(q, 'd', redis.call('HINCRBY', q.depth, 'd', num_arg(memo.d)), memo.d, memo)
  end
end


local q = { runs = KEYS[1], ck_index = KEYS[2], delay_index = KEYS[3], depth = KEYS[4],
            master = KEYS[5], qm = ARGV[3] }
local ttl_set = KEYS[6]
local now = ARGV[1] + 0 -- (client-written integers: see num in lib/record)
local vbase, wake, prefix = ARGV[2], ARGV[4], ARGV[7]
local max_queue, max_key, n = ARGV[5] + 0, ARGV[6] + 0, ARGV[8] + 0
local OWN_KEYS, OWN_ARGS = 6, 8 + 7 * n
local hooks = hooks_open(KEYS, ARGV, OWN_KEYS, OWN_ARGS, now)

-- Whether a run of variant v may be queued now (admission control); nil
-- without a limit. (A script makes a closure of every function it defines
-- at every call, some 1,100 instructions each on Redis 7.0: the functions
-- only some calls need are made only for those.)
local admitted = nil
if max_queue > 0 or max_key > 0 then
  admitted = function(v)
    if max_queue > 0 then
      local d = redis.call('HMGET', q.depth, 'r', 'd')
      if (tonumber(d[1]) or 0) + (tonumber(d[2]) or 0) >= max_queue then return 'queue_full' end
    end
    if max_key > 0 and redis.call('ZCARD', v.ready) + redis.call('ZCARD', v.delayed) >= max_key then
      return 'key_full'
    end
    return nil
  end
end

-- The answer to run i (argument base b) when its id is stored already,
-- with record old: 0 when it is the same run (same variant and payload:
-- an idempotent retry), else 'conflict'.
local function stored_answer(old, b)
  local r = rec_parse(old)
  if r.vm == ARGV[b + 1] and string.sub(old, r.pos) == string.sub(ARGV[b + 2], tonumber(ARGV[b + 3])) then
    return 0
  end
  return 'conflict'
end

-- One run at a time (few runs, or admission limits that each run reads):
-- each run's commands in turn.
local function enqueue_each()
  local out, woke = {}, false
  -- Several runs: index entries that cannot move are not written again,
  -- and the depth counts are written once at the end, unless admission
  -- reads them.
  if n > 1 then q.memo = place_memo(q, max_queue == 0) end
  for i = 0, n - 1 do
    local b = 9 + 7 * i
    local id, vm, rec, at, rs, expires = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 4], ARGV[b + 5], ARGV[b + 6]
    local v = variant_keys(vbase, vm)
    if redis.call('HSETNX', q.runs, id, rec) == 0 then
      out[i + 1] = stored_answer(redis.call('HGET', q.runs, id), b)
    else
      local refused = admitted and admitted(v)
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
  return out, woke
end

-- In bulk from BULK_AT runs (with no admission limit): below it a command
-- per run costs Redis less than sorting the runs into their sets (measured
-- on Redis 7.0 with every run of another key: the bulk path costs 10%
-- more at 10 runs, the same at 100, 20% less at 1,000; with runs of a few
-- keys it costs 5% to 40% less from 10 runs on).
local BULK_AT = 32
local out, woke
if n >= BULK_AT and max_queue == 0 and max_key == 0 then
  -- (made only for a call that writes in bulk: see admitted)
  -- Move the entries of index (ckIndex or delayIndex) as the new runs one
  -- at a time would: run k of variant vms[k] scores ss[k] (in run order),
  -- with place's memo (q.memo) sparing the ZADD LT CH an earlier run of the
  -- variant makes a no-op. Returns the variant of each move in order (a
  -- variant again when it moves again: the scheduler hears of each move, as
  -- run by run, since a hook may start its state again in between) and the
  -- lowest score moved to (as given), or nil when none moved.
  local function index_moves(index, vms, ss)
    local moves, head, head_s, head_n = {}, nil, nil, 0
    for k, vm in ipairs(vms) do
      if place_moves(q, index, vm, ss[k]) and redis.call('ZADD', index, 'LT', 'CH', ss[k], vm) == 1 then
        moves[#moves + 1] = vm
        local s = ss[k] + 0
        if head == nil or s < head then head, head_s, head_n = s, ss[k], 1 elseif s == head then head_n = head_n + 1 end
      end
    end
    if #moves == 0 then return nil end
    return moves, head_s, head_n
  end

  -- Many runs and no admission limit: each kind of write in one command
  -- (a read of the ids, the records, each variant's set, the indexes), with
  -- the outcome of the runs queued one at a time: the same data, the same
  -- answers, and the scheduler told of the same variants in the same order.
  local function enqueue_batch()
    local ids = {}
    for i = 0, n - 1 do ids[i + 1] = ARGV[9 + 7 * i] end
    local stored = redis.call('HMGET', q.runs, unpack(ids))
    local out, first = {}, {} -- first: id -> argument base of the run that queued it
    local recs, ttls, sets, vkeys = {}, {}, {}, {}
    local order = { r = {}, d = {} } -- the ready and the delayed sets, as first written
    local rvm, rss, dvm, dss = {}, {}, {}, {} -- new ready and delayed runs: variant, score
    for i = 0, n - 1 do
      local b = 9 + 7 * i
      local id = ids[i + 1]
      if stored[i + 1] then
        out[i + 1] = stored_answer(stored[i + 1], b)
      elseif first[id] then
        out[i + 1] = stored_answer(ARGV[first[id] + 2], b)
      else
        first[id] = b
        out[i + 1] = 1
        local vm, at, expires = ARGV[b + 1], ARGV[b + 4], ARGV[b + 6]
        recs[#recs + 1] = id
        recs[#recs + 1] = ARGV[b + 2]
        if expires ~= '0' then
          ttls[#ttls + 1] = expires
          ttls[#ttls + 1] = prefix .. vm .. ':' .. id
        end
        local v = vkeys[vm]
        if v == nil then
          v = variant_keys(vbase, vm)
          vkeys[vm] = v
        end
        local set, score, kind
        if at + 0 <= now then
          set, score, kind = v.ready, ARGV[b + 5], 'r'
          rvm[#rvm + 1], rss[#rss + 1] = vm, score
        else
          set, score, kind = v.delayed, at, 'd'
          dvm[#dvm + 1], dss[#dss + 1] = vm, score
        end
        local z = sets[set]
        if z == nil then
          sets[set] = { score, id }
          local o = order[kind]
          o[#o + 1] = set
        else
          z[#z + 1] = score
          z[#z + 1] = id
        end
      end
    end
    if #recs == 0 then return out, false end
    redis.call('HSET', q.runs, unpack(recs))
    if #ttls > 0 then redis.call('ZADD', ttl_set, unpack(ttls)) end
    for _, o in ipairs({ order.r, order.d }) do
      for _, set in ipairs(o) do redis.call('ZADD', set, unpack(sets[set])) end
    end
    -- A counting memo of what was placed, for place_flush: the counts, the
    -- sets of each kind in order, their ZADD arguments (two a run: see
    -- place_memo), the last run's sets.
    local memo = place_memo(q, true)
    memo.r, memo.d, memo.sets, memo.args = #rvm, #dvm, order, sets
    if #rvm > 0 then memo.last.r = vkeys[rvm[#rvm]].ready end
    if #dvm > 0 then memo.last.d = vkeys[dvm[#dvm]].delayed end
    q.memo = memo
    local woke = false
    local moved, head = index_moves(q.ck_index, rvm, rss)
    if moved then
      for _, vm in ipairs(moved) do hooks:ready_start(vm) end -- (see index_moves)
      redis.call('ZADD', q.master, 'LT', head, q.qm)
      woke = true
    end
    local head_n
    moved, head, head_n = index_moves(q.delay_index, dvm, dss)
    if moved and (redis.call('ZADD', q.master, 'LT', 'CH', head, q.qm) == 1 or not woke and place_soonest(q, head, now, head_n)) then
      woke = true
    end
    place_flush(q) -- (after the indexes' moves: it may widen them)
    return out, woke
  end
  out, woke = enqueue_batch()
else
  out, woke = enqueue_each()
end
if woke and wake ~= '' then redis.call('PUBLISH', wake, q.qm) end
hooks:finish()
return out
