-- ack: runs of one base queue are done; each is removed everywhere and its
-- concurrency released. A run that no longer exists is done already (an
-- ack whose first call went through and was sent again finds it so).
--
-- KEYS[1] -> queue runs HASH (encoded id -> record)
-- KEYS[2] -> queue held HASH ("<variant member>:<encoded id>" -> delivery token)
-- KEYS[3] -> queue key-inflight HASH (variant member -> runs in flight)
-- KEYS[4] -> env in-flight counter STRING
-- KEYS[5] -> shard leases ZSET (run member, score lease deadline ms)
-- ARGV[1] -> now (ms)
-- ARGV[2] -> run member prefix (encoded env ":" encoded queue ":")
-- ARGV[3] -> n, the number of runs (at most 1000)
-- ARGV[4+3i..6+3i] -> run i: variant member, encoded id, delivery token
-- Flag on: KEYS[6..8] and ARGV[4+3n..6+3n] follow, the scheduler's (see
-- lib/hooks_vtime).
-- Returns: one value per run: 1 acked, 0 gone already, "not_found" (the
-- run exists under another key), "not_in_flight" or "lease_lost".
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
local k = { runs = KEYS[1], held = KEYS[2], kin = KEYS[3], env_n = KEYS[4], leases = KEYS[5] }
local now, n = ARGV[1] + 0, ARGV[3] + 0 -- (see num in lib/record)
local OWN_KEYS, OWN_ARGS = 5, 3 + 3 * n
local hooks = hooks_open(KEYS, ARGV, OWN_KEYS, OWN_ARGS, now)
local out = held_ack(k, ARGV[2], ARGV, 4, n, now, hooks)
hooks:finish()
return out
