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
--@include record
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
