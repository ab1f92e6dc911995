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
--@inline
local HELD = { WIDE_AT = 64, WIDE_FIELD = '~',
               WIDE_VALUE = 'runqueue: a value longer than 64 bytes keeps this hash a hash table, see lib/held.lua' }

-- Runs of the queue in flight: the held hash's fields but its mark.
local function held_count(held)
  local n = redis.call('HLEN', held)
  if n > 0 and redis.call('HEXISTS', held, HELD.WIDE_FIELD) == 1 then n = n - 1 end
  return n
end

-- A dequeue that took the shard's token counter past a multiple of 64
-- (dq_finish tests it, for the wide sets too), with env_in runs of its env
-- in flight: mark the held hash (and kin) when due (see above). Looking
-- once per 64 tokens of the shard costs next to nothing.
local function held_widen(held, kin, env_in)
  if env_in < HELD.WIDE_AT or redis.call('HLEN', held) < HELD.WIDE_AT then return end
  redis.call('HSET', held, HELD.WIDE_FIELD, HELD.WIDE_VALUE)
  if redis.call('HLEN', kin) >= HELD.WIDE_AT then redis.call('HSET', kin, HELD.WIDE_FIELD, HELD.WIDE_VALUE) end
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
  if redis.call('HLEN', held) == 1 and redis.call('HEXISTS', held, HELD.WIDE_FIELD) == 1 then
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
