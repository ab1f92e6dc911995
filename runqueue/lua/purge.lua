-- purge: delete dead-lettered runs of one queue for good: either those
-- that died at or before a time, oldest death first, at most a limit of
-- them, or the given runs. Each run is removed from the dead set and, when
-- that removed it, its record goes (only when the record is of the run's
-- variant, as redrive checks); the env's dead count goes down once by the
-- number removed. Its id is free again afterwards. The scheduler has no
-- part in it (dead runs are not ready), so it is the same script on both
-- flags.
--
-- KEYS[1] -> queue runs HASH (encoded id -> record)
-- KEYS[2] -> queue dead ZSET (run member, score time of death ms)
-- KEYS[3] -> env dead HASH (queue member -> dead-lettered runs)
-- ARGV[1] -> queue member
-- ARGV[2] -> by time: the latest time of death (ms) to delete; by run: ""
-- ARGV[3] -> by time: the most runs to delete (1..10000, checked by the
--            caller); by run: n, the number of runs
-- ARGV[4..3+n] -> by run: the run members (env:queue:=key:id, each segment
--            encoded: the variant member is the third part, the encoded id
--            the last)
-- Returns: the number of dead-lettered runs deleted (a run not in the dead
-- set, live or gone, is left as it is and not counted).
--@include record
local runs, dead, env_dead = KEYS[1], KEYS[2], KEYS[3]
local qm, before, limit = ARGV[1], ARGV[2], ARGV[3]

local members
if before ~= '' then
  members = redis.call('ZRANGEBYSCORE', dead, '-inf', before, 'LIMIT', 0, limit)
else
  members = {}
  for i = 4, 3 + limit do members[i - 3] = ARGV[i] end
end

local n = 0
for _, member in ipairs(members) do
  if redis.call('ZREM', dead, member) == 1 then
    n = n + 1
    local vm, id = string.match(member, '^[^:]*:[^:]*:(=[^:]*):([^:]+)$')
    local rec = id and redis.call('HGET', runs, id)
    local r = rec and rec_parse(rec)
    if r and r.vm == vm then redis.call('HDEL', runs, id) end
  end
end
if n > 0 and redis.call('HINCRBY', env_dead, qm, -n) <= 0 then redis.call('HDEL', env_dead, qm) end
return n
