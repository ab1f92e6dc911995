-- dequeue (scheduler flag off): ack the runs the call carries, then serve
-- up to maxCount ready runs of one base queue in age order (lowest ready
-- score first across its variants; ties by variant member), each moved in
-- flight with a lease. One variant may give several runs in one call.
--
-- KEYS[1..11], ARGV[1..13+3a] -> see lib/dequeue
-- Returns: see dq_finish.
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


-- Whether record s has a TTL (its first field is not "0").
local function rec_has_ttl(s)
  return string.byte(s, 1) ~= 48
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

-- Runs of the queue in flight: the held hash's fields but its mark.
local function held_count(held)
  local n = redis.call('HLEN', held)
  if n > 0 and redis.call('HEXISTS', held, '~') == 1 then n = n - 1 end
  return n
end

-- A dequeue that took the shard's token counter past a multiple of 64
-- (dq_finish tests it, for the wide sets too), with env_in runs of its env
-- in flight: mark the held hash (and kin) when due (see above). Looking
-- once per 64 tokens of the shard costs next to nothing.
local function held_widen(held, kin, env_in)
  if env_in < 64 or redis.call('HLEN', held) < 64 then return end
  redis.call('HSET', held, '~', 'runqueue: a value longer than 64 bytes keeps this hash a hash table, see lib/held.lua')
  if redis.call('HLEN', kin) >= 64 then redis.call('HSET', kin, '~', 'runqueue: a value longer than 64 bytes keeps this hash a hash table, see lib/held.lua') end
end

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

-- Ack n runs of one queue, given from args[first] on (variant member,
-- encoded id, delivery token: three values a run): each is removed
-- everywhere and its concurrency released. Returns one value per run: 1
-- acked, 0 gone already (an ack sent again after its first call went
-- through, or a run acked earlier in this call, under any key), or an
-- error code (not_found, not_in_flight, lease_lost). A run asked twice in
-- one call is acked by the entry with its holder's token, whichever comes
-- first (a stale delivery's ack and the holder's, sent together): each
-- entry answers what it would answer in a call of its own after the ones
-- before it.
local function held_ack(k, prefix, args, first, n, now, hooks)
  local out, fields, ids, members, per_vm, vms, gone = {}, {}, {}, {}, {}, {}, {}
  local asked = {}
  for i = 0, n - 1 do asked[i + 1] = args[first + 3 * i] .. ':' .. args[first + 1 + 3 * i] end
  local holders = redis.call('HMGET', k.held, unpack(asked))
  for i = 0, n - 1 do
    local vm, id, token = args[first + 3 * i], args[first + 1 + 3 * i], args[first + 2 + 3 * i]
    local member = prefix .. asked[i + 1]
    local err
    if gone[id] then
      -- Acked earlier in this call, under its one key (an id names one
      -- run of the queue): its record goes at the end of the call.
      err = 'gone'
    elseif not holders[i + 1] then
      err = held_missing(k.runs, vm, id)
    elseif holders[i + 1] ~= token then
      err = 'lease_lost'
    else
      gone[id] = true
    end
    if err == 'gone' then
      out[i + 1] = 0
    elseif err then
      out[i + 1] = err
    else
      out[i + 1] = 1
      fields[#fields + 1] = asked[i + 1]
      ids[#ids + 1] = id
      members[#members + 1] = member
      if not per_vm[vm] then
        per_vm[vm] = 0
        vms[#vms + 1] = vm
      end
      per_vm[vm] = per_vm[vm] + 1
    end
  end
  if #ids > 0 then
    redis.call('HDEL', k.held, unpack(fields))
    redis.call('HDEL', k.runs, unpack(ids))
    redis.call('ZREM', k.leases, unpack(members))
    held_left(k.held, k.kin, kin_release(k.kin, vms, per_vm))
    hooks:released(vms)
    env_release(k.env_n, #ids)
  end
  return out
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

-- The machinery both dequeue scripts share, as functions over one call's
-- state dq: binding its keys and arguments, the acks a call may carry (the
-- fused ack-and-dequeue), the capacity the env and queue limits leave,
-- promotion of due delayed runs, reading variants' heads, taking runs, and
-- moving the taken runs in flight (dq_finish).
--
-- KEYS and ARGV of a dequeue script (both flag states):
-- KEYS[1] -> queue ckIndex ZSET (variant member, score head ready score ms)
-- KEYS[2] -> queue delayIndex ZSET (variant member, score earliest available_at ms)
-- KEYS[3] -> queue depth HASH (r, d)
-- KEYS[4] -> shard master ZSET (queue member, score earliest work ms)
-- KEYS[5] -> shard leases ZSET (run member, score lease deadline ms)
-- KEYS[6] -> env in-flight counter STRING
-- KEYS[7] -> queue held HASH ("<variant member>:<encoded id>" -> delivery token)
-- KEYS[8] -> queue runs HASH (encoded id -> record)
-- KEYS[9] -> queue key-inflight HASH (variant member -> runs in flight)
-- KEYS[10] -> shard delivery token counter STRING
-- KEYS[11] -> shard ttl ZSET (run member, score expiry deadline ms)
-- ARGV[1] -> now (ms)
-- ARGV[2] -> maxCount (0..2000; 0: acks only)
-- ARGV[3] -> env concurrency limit, 0 for none
-- ARGV[4] -> queue concurrency limit (all keys), 0 for none
-- ARGV[5] -> per-key concurrency limit, 0 for none
-- ARGV[6] -> lease deadline (ms)
-- ARGV[7] -> queue member
-- ARGV[8] -> run member prefix (encoded env ":" encoded queue ":")
-- ARGV[9] -> priority step (ms)
-- ARGV[10] -> scan: age-order entries read, due delayed variants promoted
-- ARGV[11] -> promote limit: runs promoted per variant per call
-- ARGV[12] -> variant key base (keys.Queue.VariantBase)
-- ARGV[13] -> a, the number of runs to ack first (at most 1000)
-- ARGV[14+3i..16+3i] -> ack i: variant member, encoded id, delivery token
--
-- Variant keys are derived from the variant member (lib/place's
-- variant_keys), in the queue's hash slot.
-- (now_arg is now as the client sent it, for commands: a Lua number
-- argument costs Redis a %.17g format, some 2,700 instructions on Redis
-- 7.0, and a constant one is written as a string for the same reason.)
local function dq_open(keys, args)
  -- Effects replication, before the first write, for the TIME dq_finish
  -- reads (the token counter's floor): Redis 6.2 run with
  -- lua-replicate-commands no refuses every write after TIME, which would
  -- leave a call's served runs out of their ready sets but never in flight.
  -- Redis 7 always replicates effects and keeps the call as a no-op.
  if redis.replicate_commands then redis.replicate_commands() end
  local acks = args[13] + 0
  local dq = {
    ck_index = keys[1], delay_index = keys[2], depth = keys[3], master = keys[4], leases = keys[5],
    env_n = keys[6], held = keys[7], runs = keys[8], kin = keys[9], tokens = keys[10], ttl = keys[11],
    now = args[1] + 0, now_arg = args[1], max_count = args[2] + 0, env_limit = args[3] + 0,
    queue_limit = args[4] + 0, key_limit = args[5] + 0, lease_deadline = args[6],
    qm = args[7], run_prefix = args[8], priority_step = args[9] + 0, scan = args[10] + 0,
    promote_limit = args[11] + 0, vbase = args[12], acks = acks, own_args = 13 + 3 * acks,
    vars = {},     -- variant member -> { ready, delayed keys; head cache; counts }
    touched = {},  -- variant members in first-serve order
    served = {},   -- ids served, in serve order
    served_vm = {}, -- their variant members
    swept = {},    -- places in served of the runs swept at their head (dq_take)
    nswept = 0,    -- how many (they do not count for cap)
    sweep_room = 0, -- runs it may sweep: DQ_TTL_LOOK when the shard has one due (dq_due)
    dirty = false, -- promotion wrote something
    -- (set later; named here so that the table is made at its full size
    -- once, not grown past 32 fields by a rehash)
    cap = 0, delay_head = nil, ck_head = nil,
  }
  return dq
end

-- The acks the call carries, before anything else: their slots count for
-- this call's capacity.
local function dq_ack(dq, hooks)
  if dq.acks == 0 then return {} end
  return held_ack({ runs = dq.runs, held = dq.held, kin = dq.kin, env_n = dq.env_n, leases = dq.leases },
    dq.run_prefix, ARGV, 14, dq.acks, dq.now, hooks)
end

-- What the env and queue limits leave of maxCount.
local function dq_capacity(dq)
  local cap = dq.max_count
  if cap > 0 and dq.env_limit > 0 then
    cap = math.min(cap, dq.env_limit - (tonumber(redis.call('GET', dq.env_n)) or 0))
  end
  if cap > 0 and dq.queue_limit > 0 then cap = math.min(cap, dq.queue_limit - held_count(dq.held)) end
  dq.cap = cap
  return cap
end

-- How many runs past their TTL a call sweeps at most (vtime.TTLLook).
local DQ_TTL_LOOK = 100

-- Whether the call may sweep: one read of the shard's TTL set, for an
-- entry due by now (the common case: none, and no head is looked up).
local function dq_due(dq)
  if redis.call('ZRANGEBYSCORE', dq.ttl, '-inf', dq.now_arg, 'LIMIT', '0', '1')[1] then
    dq.sweep_room = DQ_TTL_LOOK
  end
end

local function dq_var(dq, vm)
  local c = dq.vars[vm]
  if c == nil then
    c = variant_keys(dq.vbase, vm)
    c.taken = 0
    dq.vars[vm] = c
  end
  return c
end

-- Move up to n due runs of variant vm from delayed to ready; returns how
-- many left the delayed set.
local function dq_promote_variant(dq, hooks, vm, n)
  local c = dq_var(dq, vm)
  local due = redis.call('ZRANGEBYSCORE', c.delayed, '-inf', dq.now_arg, 'LIMIT', '0', n)
  if #due > 0 then
    local recs = redis.call('HMGET', dq.runs, unpack(due))
    local zargs, min_rs = {}, nil
    for i, id in ipairs(due) do
      -- (a run without its record, evicted under Config.AllowEviction, is
      -- dropped: it leaves the delayed set and is not made ready)
      if recs[i] then
        local r = rec_parse(recs[i])
        -- (a record that does not parse, a hand edit or a writer's bug,
        -- is made ready now: the call that serves it dead-letters it, see
        -- killCorrupt, where every promotion that reached it failed; so is
        -- one whose at gopher-lua, miniredis's Lua, cannot read as a number)
        local at = r.pr and tonumber(r.at)
        local rs = at and at - r.pr * dq.priority_step or dq.now
        if min_rs == nil or rs < min_rs then min_rs = rs end
        zargs[#zargs + 1] = rs
        zargs[#zargs + 1] = id
      end
    end
    -- (the removal first: on a Redis at maxmemory a script is refused
    -- only at its first write that may add memory, and a promotion moves
    -- runs, it does not add them; a dequeue refused for its promotion
    -- would serve nothing, and a full Redis frees memory only by serving)
    redis.call('ZREM', c.delayed, unpack(due))
    if #zargs > 0 then redis.call('ZADD', c.ready, unpack(zargs)) end
    redis.call('HINCRBY', dq.depth, 'd', -#due)
    if #zargs > 0 then
      local ready_n = redis.call('HINCRBY', dq.depth, 'r', #zargs / 2)
      if redis.call('ZADD', dq.ck_index, 'LT', 'CH', min_rs, vm) == 1 then hooks:ready_start(vm) end
      place_widen(dq, 'r', ready_n, #zargs / 2, c.ready)
    end
    dq.dirty = true
  end
  index_head(c.delayed, dq.delay_index, vm)
  return #due
end

-- Runs of vm in flight before this call.
local function dq_inflight(dq, vm)
  local c = dq_var(dq, vm)
  if c.inflight_n == nil then c.inflight_n = tonumber(redis.call('HGET', dq.kin, vm)) or 0 end
  return c.inflight_n
end

-- True when vm's own limit blocks another serve.
local function dq_at_limit(dq, vm)
  if dq.key_limit <= 0 then return false end
  local c = dq_var(dq, vm)
  return dq_inflight(dq, vm) + c.taken - (c.swept or 0) >= dq.key_limit
end

-- dq_promote's second and third passes of a flag-off call
-- (vtime.spreadLeft) over the due variants at the positions filled
-- (those that filled their first share; then again over those not held,
-- with what the held took), plan holding what each took: each takes up to
-- the same share of left, ceil(left / #filled), within the promote limit;
-- those that filled that take what is still left, in order.
local function dq_spread(dq, hooks, due, plan, filled, left)
  if left <= 0 or not filled[1] then return end
  local limit = dq.promote_limit
  local share = math.ceil(left / #filled)
  local again = {}
  for _, i in ipairs(filled) do
    local want = math.min(share, limit - plan[i])
    if want > 0 then
      local got = dq_promote_variant(dq, hooks, due[i], want)
      if got == want then again[#again + 1] = i end
      plan[i] = plan[i] + got
      left = left - got
    end
  end
  for _, i in ipairs(again) do
    if left <= 0 then break end
    local more = math.min(limit - plan[i], left)
    if more > 0 then
      local got = dq_promote_variant(dq, hooks, due[i], more)
      plan[i] = plan[i] + got
      left = left - got
    end
  end
end

-- dq_promote's later passes of a flag-on call (vtime.fillByWeight): total
-- goes to the due variants at the positions among by weighted
-- water-filling, ws their milli-weights. Each can take cap = min(promote
-- limit - plan, its due runs left) more (one ZCOUNT of its due runs the
-- first time it is needed, kept in rest); in increasing order of cap /
-- weight, one whose cap is within its part of what is still to give, cap
-- <= total x weight / the weights' sum over those not yet given, takes
-- its cap, and the others take ceil(total x weight / sum) of what is left
-- then (within their cap). Then each is promoted once, in the order the
-- call reached them: what a variant cannot take goes to the others by
-- weight, none by its place.
local function dq_fill(dq, hooks, due, plan, among, total, ws, rest)
  local limit = dq.promote_limit
  local cand, cap = {}, {}
  for _, i in ipairs(among) do
    local c = limit - plan[i]
    if c > 0 then
      if rest[i] == nil then
        rest[i] = redis.call('ZCOUNT', dq_var(dq, due[i]).delayed, '-inf', dq.now_arg)
      end
      c = math.min(c, rest[i])
    end
    if c > 0 then
      cand[#cand + 1] = i
      cap[i] = c
    end
  end
  table.sort(cand, function(a, b)
    local x, y = cap[a] * ws[b], cap[b] * ws[a]
    if x ~= y then return x < y end
    return a < b
  end)
  local sum = 0
  for _, i in ipairs(cand) do sum = sum + ws[i] end
  local give, k = {}, 1
  while cand[k] and cap[cand[k]] * sum <= total * ws[cand[k]] do
    local i = cand[k]
    give[i] = cap[i]
    total = total - cap[i]
    sum = sum - ws[i]
    k = k + 1
  end
  for j = k, #cand do
    local i = cand[j]
    give[i] = math.ceil(total * ws[i] / sum)
  end
  for _, i in ipairs(among) do
    local g = give[i]
    if g and g > 0 then
      local got = dq_promote_variant(dq, hooks, due[i], g)
      plan[i] = plan[i] + got
      rest[i] = rest[i] - got
    end
  end
end

-- Promote the due delayed runs of the first scan due variants, as many of
-- each as the plan gives (vtime.PromotePlan flag off,
-- vtime.PromotePlanWeighted flag on): the call's budget, max(promote
-- limit, maxCount). First every variant takes up to its share, fixed when
-- the call starts: flag off the same, min(limit, ceil(budget /
-- variants)); flag on by weight, min(limit, ceil(budget x weight / the
-- variants' sum)). Then what they left goes to those that filled their
-- share: flag off by dq_spread (the same share again, then what is still
-- left in order), flag on by dq_fill (weighted water-filling). Then the
-- variants at their key limit (held: the call cannot serve them) keep what
-- they took, and the others take as much again, spread or filled as before
-- over those not held that filled their first share, so that the budget
-- goes whole to the variants the call can serve. So one call promotes
-- fewer than 2 x (budget + scan) runs however many are due, and a share
-- one variant left unused goes to others (flag off, what the second pass
-- leaves by a variant's place in the delay index: due time, then
-- member). A look at delayIndex's head comes first: when nothing is due
-- (the common case) it is all the call reads of delayed runs, and
-- dq_finish reuses it. pick, when given (the flag-on dequeue), chooses the
-- variants when more than scan are due: it gets the first scan + 1 and
-- returns those to promote. weigh, when given (the flag-on dequeue), gets
-- the variants to promote and returns their milli-weights.
local function dq_promote(dq, hooks, pick, weigh)
  local head = redis.call('ZRANGE', dq.delay_index, '0', '0', 'WITHSCORES')
  if not head[2] then
    dq.delay_head = false
    return
  end
  if num(head[2]) > dq.now then
    dq.delay_head = num(head[2])
    return
  end
  local n = dq.scan
  if pick then n = n + 1 end
  local due = redis.call('ZRANGEBYSCORE', dq.delay_index, '-inf', dq.now_arg, 'LIMIT', '0', n)
  if #due > dq.scan then due = pick(due) end
  local limit = dq.promote_limit
  local left = math.max(limit, dq.max_count)
  local share = math.min(limit, math.ceil(left / #due))
  local ws, sum = weigh and weigh(due), 0
  if ws then
    for i = 1, #ws do sum = sum + ws[i] end
  end
  local budget = left
  local filled, plan = {}, {}
  for i, vm in ipairs(due) do
    if ws then share = math.min(limit, math.ceil(budget * ws[i] / sum)) end
    local got = dq_promote_variant(dq, hooks, vm, share)
    if got == share then filled[#filled + 1] = i end
    plan[i] = got
    left = left - got
  end
  local spread, rest = ws and dq_fill or dq_spread, {}
  if left > 0 and filled[1] then spread(dq, hooks, due, plan, filled, left, ws, rest) end
  if dq.key_limit <= 0 then return end
  local more, free = 0, {}
  for _, i in ipairs(filled) do
    if not dq_at_limit(dq, due[i]) then free[#free + 1] = i end
  end
  for i, vm in ipairs(due) do
    if dq_at_limit(dq, vm) then more = more + plan[i] end
  end
  if more > 0 and free[1] then spread(dq, hooks, due, plan, free, more, ws, rest) end
end

-- Head of variant vm's ready ZSET as seen by this call (after the runs it
-- took), walked in memory: the first read takes up to 8 entries, each
-- further read doubles what is held, never past cap + 1 + sweep_room in
-- all (one more than the call can take and sweep, so running out of a
-- short read means the variant is empty).
-- Returns the head's ready score and id, or nil.
local function dq_head(dq, vm)
  local c = dq_var(dq, vm)
  local most = dq.cap + 1 + dq.sweep_room
  if c.list == nil then
    local want = math.min(most, 2)
    c.list = redis.call('ZRANGE', c.ready, '0', num_arg(want - 1), 'WITHSCORES')
    c.complete = #c.list < 2 * want
  end
  local p = 2 * c.taken + 1
  if c.list[p] == nil and not c.complete then
    local have = #c.list / 2
    local want = math.min(have, most - have)
    if want > 0 then
      local more = redis.call('ZRANGE', c.ready, num_arg(have), num_arg(have + want - 1), 'WITHSCORES')
      for _, x in ipairs(more) do c.list[#c.list + 1] = x end
      c.complete = #more < 2 * want
    end
  end
  if c.list[p] == nil then return nil end
  return num(c.list[p + 1]), c.list[p]
end

-- True when the head of vm (dq_head found one) has passed its TTL (its
-- TTL entry, due by now) and the call swept fewer than DQ_TTL_LOOK (vtime's
-- sweepHead): the call sweeps it (dq_take with swept). Each such run is
-- swept where the call meets it, as the TTL sweep would delete it: no
-- serve, not counted for the call's capacity or its key's limit.
local function dq_head_due(dq, vm)
  if dq.nswept >= dq.sweep_room then return false end
  local c = dq_var(dq, vm)
  local at = redis.call('ZSCORE', dq.ttl, dq.run_prefix .. vm .. ':' .. c.list[2 * c.taken + 1])
  return at and num(at) <= dq.now or false
end

-- Serve the head of vm (dq_head found one), or, swept, sweep it (it
-- counts neither for cap nor for vm's limit; dq_finish deletes it);
-- returns the next head's ready score, or nil when vm has no ready run
-- left.
local function dq_take(dq, vm, swept)
  local c = dq_var(dq, vm)
  local p = 2 * c.taken + 1
  local id = c.list[p]
  if c.taken == 0 then dq.touched[#dq.touched + 1] = vm end
  c.taken = c.taken + 1
  local k = #dq.served + 1
  dq.served[k], dq.served_vm[k] = id, vm
  if swept then
    c.swept = (c.swept or 0) + 1
    dq.swept[k] = c.list[p + 1] -- its ready score (see dq_finish's back)
    dq.nswept = dq.nswept + 1
  end
  return (dq_head(dq, vm))
end

-- Persist the serves chosen in memory: take the runs out of their ready
-- sets, move them in flight with a lease and a delivery token (unique in
-- the shard for ever: a counter), fix the indexes, the counts and the
-- master score. Records are returned as stored, unparsed (Go reads them);
-- a served run with a TTL leaves the TTL set (its record keeps the
-- deadline until the next rewrite clears it: see lib/record). A run taken
-- whose TTL passed (never delivered, its deadline at or before the call's
-- time) is expired instead, as the TTL sweep would have (vtime's
-- expireTaken): its record and TTL entry go, it takes no slot, lease or
-- token, and, unless the call swept it (dq_take), its variant is in
-- dq.expired_vms (the flag-on dequeue frees its slot for the scheduler as
-- an ack does).
-- Returns a flat array: acks' results count, the acks' results, then for
-- each run taken, in the order taken: encoded id, variant member, record,
-- delivery token; for one expired: encoded id, variant member, false, 0,
-- or -1 for one swept.
local function dq_finish(dq, acked)
  local out = { #acked }
  for _, a in ipairs(acked) do out[#out + 1] = a end
  if #dq.served == 0 then
    if dq.dirty then master_refresh(dq.ck_index, dq.delay_index, dq.master, dq.qm, dq.delay_head, dq.ck_head) end
    return out
  end
  local ids, vms = dq.served, dq.served_vm
  local recs = redis.call('HMGET', dq.runs, unpack(ids))
  -- skip: the places in dq.served of the runs taken whose TTL passed. The
  -- record decides: a run swept for a TTL entry its record does not have
  -- (a hand edit) goes back to its ready set at its score, neither
  -- delivered nor expired (back: its place -> its record's deadline, or
  -- false), and its entry is mended.
  local skip, back = nil, nil
  for i = 1, #ids do
    local rec = recs[i]
    local ttl = false -- the record's deadline (of the variant taken), if any
    if rec and rec_has_ttl(rec) then
      local r = rec_parse(rec)
      if r.ttl and r.vm == vms[i] then ttl = r.ttl end
    end
    if ttl and ttl + 0 <= dq.now then
      skip = skip or {}
      skip[i] = true
    elseif dq.swept[i] then
      back = back or {}
      back[i] = ttl
    end
  end
  if skip or back then
    -- The live runs in lists of their own; the expired ones counted per
    -- variant (c.expired).
    local lids, lvms, lrecs, gids, gmembers = {}, {}, {}, {}, {}
    skip = skip or {}
    dq.expired_vms = {}
    for i = 1, #ids do
      local vm = vms[i]
      if back and back[i] ~= nil then
        local c = dq.vars[vm]
        c.back = c.back or {}
        c.back[#c.back + 1] = dq.swept[i]
        c.back[#c.back + 1] = ids[i]
        local member = dq.run_prefix .. vm .. ':' .. ids[i]
        if back[i] then
          redis.call('ZADD', dq.ttl, back[i], member)
        else
          redis.call('ZREM', dq.ttl, member)
        end
      elseif skip[i] then
        local c = dq.vars[vm]
        if not dq.swept[i] and not c.released then
          c.released = true
          dq.expired_vms[#dq.expired_vms + 1] = vm
        end
        c.expired = (c.expired or 0) + 1
        gids[#gids + 1] = ids[i]
        gmembers[#gmembers + 1] = dq.run_prefix .. vm .. ':' .. ids[i]
      else
        local k = #lids + 1
        lids[k], lvms[k], lrecs[k] = ids[i], vm, recs[i]
      end
    end
    if not dq.expired_vms[1] then dq.expired_vms = nil end -- (all swept)
    if gids[1] then
      redis.call('HDEL', dq.runs, unpack(gids))
      redis.call('ZREM', dq.ttl, unpack(gmembers))
    end
    ids, vms, recs = lids, lvms, lrecs
  end
  -- The in-flight counts of the touched variants not read yet, in one read;
  -- a call that touched one variant whose count it has not read adds to it
  -- instead (one command, not a read and a write).
  local unread = {}
  for _, vm in ipairs(dq.touched) do
    if dq.vars[vm].inflight_n == nil then unread[#unread + 1] = vm end
  end
  local added = #dq.touched == 1 and #unread == 1
  if not added and #unread > 0 then
    local ns = redis.call('HMGET', dq.kin, unpack(unread))
    for i, vm in ipairs(unread) do dq.vars[vm].inflight_n = tonumber(ns[i]) or 0 end
  end
  -- dq_head read past the last run taken (or found the set ended), so the
  -- new head of each touched variant is known without reading it again.
  local heads, emptied, counts = {}, {}, {}
  local nback = 0
  for _, vm in ipairs(dq.touched) do
    local c = dq.vars[vm]
    redis.call('ZREMRANGEBYRANK', c.ready, '0', num_arg(c.taken - 1))
    local p = 2 * c.taken + 1
    local head = c.list[p] and c.list[p + 1]
    c.idle = c.expired or 0 -- runs taken that are not in flight
    if c.back then
      redis.call('ZADD', c.ready, unpack(c.back))
      for j = 1, #c.back, 2 do
        if not head or num(c.back[j]) < num(head) then head = c.back[j] end
      end
      c.idle = c.idle + #c.back / 2
      nback = nback + #c.back / 2
    end
    if head then
      heads[#heads + 1] = head
      heads[#heads + 1] = vm
    else
      emptied[#emptied + 1] = vm
    end
    -- (a variant whose runs taken all expired keeps its count as it is)
    if not added and c.taken > c.idle then
      counts[#counts + 1] = vm
      counts[#counts + 1] = num_arg(dq_inflight(dq, vm) + c.taken - c.idle)
    end
  end
  for i = 1, #heads, 1000 do
    redis.call('ZADD', dq.ck_index, unpack(heads, i, math.min(i + 999, #heads)))
  end
  for i = 1, #emptied, 1000 do
    redis.call('ZREM', dq.ck_index, unpack(emptied, i, math.min(i + 999, #emptied)))
  end
  -- (the counts after the removals: on a Redis at maxmemory a script is
  -- refused only at its first write that may add memory, and a serve's
  -- first write removes runs from their ready sets, so a full Redis still
  -- hands out runs, whose acks free memory)
  if added then
    local c = dq.vars[unread[1]]
    if c.taken > c.idle then
      redis.call('HINCRBY', dq.kin, unread[1], num_arg(c.taken - c.idle))
    end
  elseif #counts > 0 then
    redis.call('HSET', dq.kin, unpack(counts))
  end
  depth_sub(dq.depth, 'r', #dq.served - nback)

  local n = #ids
  if n == 0 then
    local o = #out
    for i, id in ipairs(dq.served) do
      if not (back and back[i] ~= nil) then
        out[o + 1], out[o + 2], out[o + 3], out[o + 4] = id, dq.served_vm[i], false, dq.swept[i] and -1 or 0
        o = o + 4
      end
    end
    master_refresh(dq.ck_index, dq.delay_index, dq.master, dq.qm, dq.delay_head, dq.ck_head)
    return out
  end
  local token0 = redis.call('INCRBY', dq.tokens, num_arg(n)) - n
  -- The counter never runs behind the clock: a call that finds it below
  -- the time in microseconds (below 2^52 until the year 2112), rounded
  -- down to a multiple of 10,240, moves it there. The time is the later of
  -- the call's (the caller's clock, as it sent the call) and the server's
  -- (TIME): a call that go-redis sent again after the master it first went
  -- to died, to the replica that took over, carries its caller's time from
  -- before the failover, and would deal again the tokens the dead master
  -- dealt after it. A new counter (a new shard, or its key lost with the
  -- data: a restart without persistence) and one behind (a failover to a
  -- replica that had not received the last deliveries) so start above
  -- every token dealt before, at an earlier time, so that a holder of a
  -- delivery from before the loss cannot act on one made after it. While
  -- the shard deals fewer than about 10,176 tokens per 10.24 ms (10,240
  -- less the place kept below), that is one SET per 10.24 ms at most. The
  -- floor is a multiple of 64, as 0 is, and a move keeps the counter's
  -- place among the multiples of 64: the wide checks below fall once per
  -- 64 deliveries however often the counter moves (the cost stays the same
  -- from one counter to the next, and under a clock that runs fast against
  -- the work, as the server's does under a profiler).
  local time = redis.call('TIME')
  local floor = math.min(math.max(dq.now * 1000, time[1] * 1000000 + time[2]), 4503599627370496)
  floor = floor - floor % 10240
  if token0 < floor then
    token0 = floor + token0 % 64
    redis.call('SET', dq.tokens, num_arg(token0 + n))
  end
  local env_in = redis.call('INCRBY', dq.env_n, num_arg(n))
  local fields, leases = {}, {}
  for i, id in ipairs(ids) do
    local vm = vms[i]
    fields[2 * i - 1] = vm .. ':' .. id
    fields[2 * i] = num_arg(token0 + i)
    leases[2 * i - 1] = dq.lease_deadline
    leases[2 * i] = dq.run_prefix .. vm .. ':' .. id
  end
  redis.call('HSET', dq.held, unpack(fields))
  redis.call('ZADD', dq.leases, unpack(leases))
  -- Once per 64 tokens of the shard (past a multiple of 64): the wide
  -- marks of the in-flight hashes (lib/held) and the wide sets (lib/place).
  if n >= 64 or (token0 + n) % 64 < n then
    held_widen(dq.held, dq.kin, env_in)
    widen({ dq.ck_index, dq.leases }, dq.runs)
  end
  -- The runs in the order taken, the expired ones in their places.
  local expiring = {}
  local o, j = #out, 0
  for i, id in ipairs(dq.served) do
    if back and back[i] ~= nil then
      o = o - 4 -- (back in its ready set: not in the reply)
    elseif skip and skip[i] then
      out[o + 1], out[o + 2], out[o + 3], out[o + 4] = id, dq.served_vm[i], false, dq.swept[i] and -1 or 0
    else
      j = j + 1
      out[o + 1], out[o + 2], out[o + 3], out[o + 4] = id, vms[j], recs[j], token0 + j
      -- (no record: the runs hash was evicted, Config.AllowEviction; the
      -- run goes out without one and the client acks it at once)
      if recs[j] and rec_has_ttl(recs[j]) then expiring[#expiring + 1] = leases[2 * j] end
    end
    o = o + 4
  end
  if #expiring > 0 then redis.call('ZREM', dq.ttl, unpack(expiring)) end
  master_refresh(dq.ck_index, dq.delay_index, dq.master, dq.qm, dq.delay_head, dq.ck_head)
  return out
end
-- A window is the part of a sorted set a dequeue read: its first n entries
-- ({vm, s} in ZSET order: score, then member), kept sorted in memory as
-- scores change. raw is a ZRANGE WITHSCORES reply of up to n + 1 entries;
-- when it holds n + 1, the last is the bound: the first entry left out,
-- which the call does not change, and every unread entry sorts after it.
-- An entry whose new score sorts after the bound leaves the window, since
-- unread entries may sort before it; a set read whole (raw holds at most n
-- entries) has no bound. Its entries are a span (lib/span).
-- A span: a sorted list kept as s.list[s.head..s.tail], for the windows
-- both dequeues keep of the variants they read. A serve takes an entry
-- near the front and puts it back further on: dropping the front by
-- moving head on, and inserting by shifting the shorter side, costs a few
-- moves where table.remove and table.insert shift every later entry
-- through Lua's C API (some 100 instructions each).

-- Insert e at position lo (head <= lo <= tail + 1): the entries before lo
-- move one place back when the head has room and they are fewer, else
-- those from lo one place on.
local function span_insert(s, lo, e)
  local list = s.list
  if s.head > 1 and lo - s.head < s.tail + 1 - lo then
    for j = s.head, lo - 1 do list[j - 1] = list[j] end
    s.head = s.head - 1
    list[lo - 1] = e
  else
    for j = s.tail, lo, -1 do list[j + 1] = list[j] end
    s.tail = s.tail + 1
    list[lo] = e
  end
end

-- Insert e at its rank in the sorted span: before the first entry it sorts
-- before by less (a binary search: a call of n serves over n entries costs
-- n log n comparisons, not n^2). A served entry most often sorts last, so
-- the last entry is compared first.
local function span_place(s, e, less)
  local list = s.list
  local lo, hi = s.head, s.tail + 1
  if lo < hi and not less(e, list[hi - 1]) then lo = hi end
  while lo < hi do
    local mid = lo + hi
    mid = (mid - mid % 2) / 2 -- (floor without a call)
    if less(e, list[mid]) then hi = mid else lo = mid + 1 end
  end
  span_insert(s, lo, e)
end

-- Remove the entry at position i (head <= i <= tail) and return it: the
-- entries before it move one place on (none when i is the head).
local function span_remove(s, i)
  local list = s.list
  local e = list[i]
  for j = i, s.head + 1, -1 do list[j] = list[j - 1] end
  list[s.head] = nil
  s.head = s.head + 1
  return e
end

-- a < b comparing bytes, as a ZSET orders members (Lua's "<" on strings
-- follows the server's locale: LC_COLLATE).
local function bytes_less(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

local function entry_before(a, b) return a.s < b.s or (a.s == b.s and bytes_less(a.vm, b.vm)) end

local function window_new(raw, n)
  local list = {}
  for i = 1, #raw, 2 do list[#list + 1] = { vm = raw[i], s = num(raw[i + 1]) } end
  local w = { list = list, head = 1, tail = #list, bound = nil }
  if #list > n then
    w.bound = { vm = list[n + 1].vm, s = list[n + 1].s }
    for i = #list, n + 1, -1 do list[i] = nil end
    w.tail = n
  end
  return w
end

-- First member of the window for which ok(vm) holds, or nil.
local function window_first(w, ok)
  local list = w.list
  for i = w.head, w.tail do
    local vm = list[i].vm
    if ok(vm) then return vm end
  end
  return nil
end

-- Remove vm; returns its entry, or nil when it was not in the window.
local function window_remove(w, vm)
  local list = w.list
  for i = w.head, w.tail do
    if list[i].vm == vm then return span_remove(w, i) end
  end
  return nil
end

-- Re-sort vm with its new score s, if it is in the window.
local function window_move(w, vm, s)
  local e = window_remove(w, vm)
  if e == nil then return end
  e.s = s
  if w.bound ~= nil and entry_before(w.bound, e) then return end
  span_place(w, e, entry_before)
end

-- The lowest score of the set the window was read from, after the moves
-- and removals the window saw (the set changed through it alone): its
-- first entry, or the bound, a stored entry below every other unread one;
-- false when the set was read whole and is now empty. (The bound was once
-- the n-th entry as read: when the call served or emptied that variant,
-- the score was one no stored entry had, and the shard master kept the
-- queue earlier than its oldest work.)
local function window_low(w)
  local first = w.list[w.head]
  local s = first and first.s
  if w.bound ~= nil and (s == nil or w.bound.s < s) then s = w.bound.s end
  if s == nil then return false end
  return s
end
local OWN_KEYS = 11
local dq = dq_open(KEYS, ARGV)
local hooks = hooks_open(KEYS, ARGV, OWN_KEYS, dq.own_args, dq.now)
local acked = dq_ack(dq, hooks)
if dq_capacity(dq) <= 0 then return dq_finish(dq, acked) end
-- Runs past their TTL are swept where the call meets them at the head of
-- their variant (lib/dequeue's dq_head_due): not served, not counted for
-- the capacity. dq_due looks whether the shard has any.
dq_due(dq)
dq_promote(dq, hooks)

-- Age order: the first scan entries of ckIndex (lowest head ready score,
-- then member); each serve takes the first servable one.
-- Without a per-key limit every variant in ckIndex is servable and each
-- serve moves one variant back, so the call can only serve among the first
-- cap (and the runs it may sweep): reading further (a costly WITHSCORES
-- reply) would change nothing.
local reach = dq.scan
if dq.key_limit <= 0 then reach = math.min(dq.scan, dq.cap + dq.sweep_room) end
local age = window_new(redis.call('ZRANGE', dq.ck_index, '0', num_arg(reach), 'WITHSCORES'), reach)
-- A variant ckIndex names whose ready set is empty before the call takes
-- anything from it (its runs taken out by hand, the set evicted) is stale:
-- it leaves ckIndex. Left there, at the head of age order, such entries
-- held every call of maxCount at most their number, for ever, serving
-- nothing. (A variant this call empties leaves the window as it does.)
local stale, is_stale = {}, {}
local function servable(vm)
  if dq_at_limit(dq, vm) then return false end
  if dq_head(dq, vm) ~= nil then return true end
  if not is_stale[vm] then
    is_stale[vm] = true
    stale[#stale + 1] = vm
  end
  return false
end
while #dq.served - dq.nswept < dq.cap do
  local vm = window_first(age, servable)
  if vm == nil then break end
  local nxt = dq_take(dq, vm, dq_head_due(dq, vm))
  if nxt == nil then
    window_remove(age, vm)
  else
    window_move(age, vm, nxt)
  end
end
if #stale > 0 then
  for _, vm in ipairs(stale) do window_remove(age, vm) end
  for i = 1, #stale, 1000 do
    redis.call('ZREM', dq.ck_index, unpack(stale, i, math.min(i + 999, #stale)))
  end
  dq.dirty = true
end
dq.ck_head = window_low(age) -- ckIndex's new head: no read for the master score
return dq_finish(dq, acked)
