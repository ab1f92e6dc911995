-- Recompute the queue's score in the shard master ZSET: the earliest time it
-- has work (lowest ready head score, or earliest delayed available_at).
local function master_refresh(ck_index, delay_index, master, qm)
  local r = redis.call('ZRANGE', ck_index, 0, 0, 'WITHSCORES')
  local d = redis.call('ZRANGE', delay_index, 0, 0, 'WITHSCORES')
  local best = nil
  if r[2] then best = tonumber(r[2]) end
  if d[2] then
    local x = tonumber(d[2])
    if best == nil or x < best then best = x end
  end
  if best == nil then
    redis.call('ZREM', master, qm)
  else
    redis.call('ZADD', master, best, qm)
  end
end

-- Put a queued run into its variant: ready (scored by ready score) when
-- available_at <= now, else delayed (scored by available_at). Maintains the
-- depth counters, ckIndex / delayIndex (LT keeps the head) and the master
-- score. Returns true when the run is ready. on_ready_start(vm) runs when the
-- variant gains its first ready run (the scheduler's registration hook).
local function place(q, v, id, vm, at, rs, now)
  if at <= now then
    redis.call('ZADD', v.ready, rs, id)
    redis.call('HINCRBY', q.depth, 'r', 1)
    if redis.call('ZADD', q.ck_index, 'LT', rs, vm) == 1 then
      on_ready_start(vm)
    end
    redis.call('ZADD', q.master, 'LT', rs, q.qm)
    return true
  end
  redis.call('ZADD', v.delayed, at, id)
  redis.call('HINCRBY', q.depth, 'd', 1)
  redis.call('ZADD', q.delay_index, 'LT', at, vm)
  redis.call('ZADD', q.master, 'LT', at, q.qm)
  return false
end

-- Remove a queued run from its variant (ready or delayed) and fix the
-- indexes. on_ready_empty(vm) runs when the variant's last ready run leaves.
local function unplace(q, v, id, vm, st)
  if st == 'r' then
    if redis.call('ZREM', v.ready, id) == 0 then return false end
    redis.call('HINCRBY', q.depth, 'r', -1)
    local head = redis.call('ZRANGE', v.ready, 0, 0, 'WITHSCORES')
    if head[2] then
      redis.call('ZADD', q.ck_index, head[2], vm)
    else
      redis.call('ZREM', q.ck_index, vm)
      on_ready_empty(vm)
    end
  else
    if redis.call('ZREM', v.delayed, id) == 0 then return false end
    redis.call('HINCRBY', q.depth, 'd', -1)
    local head = redis.call('ZRANGE', v.delayed, 0, 0, 'WITHSCORES')
    if head[2] then
      redis.call('ZADD', q.delay_index, head[2], vm)
    else
      redis.call('ZREM', q.delay_index, vm)
    end
  end
  master_refresh(q.ck_index, q.delay_index, q.master, q.qm)
  return true
end
