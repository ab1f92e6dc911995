-- purge: delete the given dead-lettered runs of one queue for good, those
-- that died at or before a time when one is given. Each run is removed
-- from the dead set and, when that removed it, its record goes (only when
-- the record is of the run's variant, as redrive checks); the env's dead
-- count goes down once by the number removed. Its id is free again
-- afterwards. The scheduler has no part in it (dead runs are not ready),
-- so it is the same script on both flags.
--
-- PurgeDeadLetters reads the runs to delete first (the oldest deaths, at
-- most its limit) and passes them with its time, so that a call sent again
-- (go-redis resends a script whose reply timed out) deletes none of the
-- runs the first one left: the time keeps out a run redriven and dead
-- again since the read.
--
-- KEYS[1] -> queue runs HASH (encoded id -> record)
-- KEYS[2] -> queue dead ZSET (run member, score time of death ms)
-- KEYS[3] -> env dead HASH (queue member -> dead-lettered runs)
-- ARGV[1] -> queue member
-- ARGV[2] -> the latest time of death (ms) to delete, or "" for any
-- ARGV[3] -> n, the number of runs (at most 10000, checked by the caller)
-- ARGV[4..3+n] -> the run members (env:queue:=key:id, each segment
--            encoded: the variant member is the third part, the encoded id
--            the last)
-- Returns: the number of dead-lettered runs deleted (a run not in the dead
-- set, live or gone, or dead since after the time, is left as it is and
-- not counted).
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
local runs, dead, env_dead = KEYS[1], KEYS[2], KEYS[3]
local qm, before, count = ARGV[1], ARGV[2], ARGV[3] + 0
local bound = before ~= '' and before + 0

local n = 0
for first = 4, 3 + count, 1000 do
  local last = math.min(first + 999, 3 + count)
  -- With a time, the deaths of a chunk in one read (ZMSCORE: unpack takes
  -- at most a few thousand values), not one ZSCORE a run.
  local at = bound and redis.call('ZMSCORE', dead, unpack(ARGV, first, last))
  for i = first, last do
    local member = ARGV[i]
    local died = at and num(at[i - first + 1])
    if (not bound or (died and died <= bound)) and redis.call('ZREM', dead, member) == 1 then
      n = n + 1
      local vm, id = string.match(member, '^[^:]*:[^:]*:(=[^:]*):([^:]+)$')
      local rec = id and redis.call('HGET', runs, id)
      local r = rec and rec_parse(rec)
      -- (a record that does not parse, dead-lettered by a lease recovery,
      -- is removed too)
      if r and (r.vm == vm or not r.att) then redis.call('HDEL', runs, id) end
    end
  end
end
if n > 0 and redis.call('HINCRBY', env_dead, qm, -n) <= 0 then redis.call('HDEL', env_dead, qm) end
return n
