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

-- Take n queued runs off the depth counter field ('r' or 'd'). When the
-- queue then holds no queued run, the counters are deleted, so a queue whose
-- last run is acked, dead-lettered or expired leaves no key behind.
local function depth_sub(depth, field, n)
  if redis.call('HINCRBY', depth, field, num_arg(-n)) > 0 then return end
  local other = 'd'
  if field == 'd' then other = 'r' end
  if (tonumber(redis.call('HGET', depth, other)) or 0) <= 0 then redis.call('DEL', depth) end
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







-- Point vm's entry in index (ckIndex or delayIndex) at the head score of
-- its set, or remove the entry when the set is empty. Returns false then.
local function index_head(set, index, vm)
  local head = redis.call('ZRANGE', set, '0', '0', 'WITHSCORES')
  if head[2] then
    redis.call('ZADD', index, head[2], vm)
    return true
  end
  redis.call('ZREM', index, vm)
  return false
end

-- Remove queued run id from its variant (ready or delayed) and fix the
-- indexes. hooks:ready_empty(vm) runs when the variant's last ready run
-- leaves. Returns false when the run was not queued.
local function unplace(q, v, hooks, id, vm)
  if redis.call('ZREM', v.ready, id) == 1 then
    depth_sub(q.depth, 'r', 1)
    if not index_head(v.ready, q.ck_index, vm) then hooks:ready_empty(vm) end
  elseif redis.call('ZREM', v.delayed, id) == 1 then
    depth_sub(q.depth, 'd', 1)
    index_head(v.delayed, q.delay_index, vm)
  else
    return false
  end
  master_refresh(q.ck_index, q.delay_index, q.master, q.qm)
  return true
end
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
