-- extend: heartbeat; move the lease deadline of a held run.
--
-- KEYS[1] -> queue runs HASH (encoded id -> record)
-- KEYS[2] -> queue held HASH ("<variant member>:<encoded id>" -> delivery token)
-- KEYS[3] -> shard leases ZSET (run member, score lease deadline ms)
-- ARGV[1] -> encoded message id
-- ARGV[2] -> variant member
-- ARGV[3] -> run member
-- ARGV[4] -> delivery token of the holder
-- ARGV[5] -> new lease deadline (ms)
-- Returns: 1.
-- Errors: RQ_NOT_FOUND, RQ_NOT_IN_FLIGHT, RQ_LEASE_LOST.
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



local HELD_ERRORS = {
  gone = 'RQ_NOT_FOUND no such run',
  not_found = 'RQ_NOT_FOUND no such run',
  not_in_flight = 'RQ_NOT_IN_FLIGHT run is not in flight',
  lease_lost = 'RQ_LEASE_LOST lease is held by a later delivery',
  lease_active = 'RQ_LEASE_ACTIVE lease has not expired',
}

local runs, held, leases = KEYS[1], KEYS[2], KEYS[3]
local id, vm, member, token, deadline = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local _, err = held_check(runs, held, leases, vm, id, member, token, 0)
if err then return redis.error_reply(HELD_ERRORS[err]) end
-- The entry is moved by a removal and an add, not ZADD XX: on a Redis at
-- maxmemory a script is refused at its first write that may add memory
-- (a ZADD, whatever its XX), and a removal first lets the heartbeat of a
-- long run through.
if redis.call('ZREM', leases, member) == 1 then redis.call('ZADD', leases, deadline, member) end
return 1
