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
--@include record
--@include place
--@include held
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
    if field ~= HELD.WIDE_FIELD then count(field) end
  end
  for i = 3, #ARGV do
    local field = string.sub(ARGV[i], #prefix + 1)
    if redis.call('HEXISTS', held, field) == 0 and redis.call('ZSCORE', leases, ARGV[i]) then count(field) end
  end
  local fixed, have = 0, {}
  local kv = redis.call('HGETALL', kin)
  for i = 1, #kv, 2 do
    if kv[i] ~= HELD.WIDE_FIELD then
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
    if field ~= HELD.WIDE_FIELD and redis.call('HEXISTS', held, field) == 1
        and not redis.call('ZSCORE', leases, member) then
      redis.call('ZADD', leases, deadline, member)
      added = added + 1
    end
  end
  return added
end

return redis.error_reply('runqueue: repair: unknown part ' .. tostring(part))
