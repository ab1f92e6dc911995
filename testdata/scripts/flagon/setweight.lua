-- setweight: set or clear the scheduler weight of one concurrency key.
--
-- KEYS[1] -> queue weights HASH (variant member -> weight)
-- KEYS[2] -> queue ckVtimeFloor STRING (its last field counts the weights)
-- ARGV[1] -> variant member
-- ARGV[2] -> weight (0.001..1000, checked by the caller), "" to clear
-- ARGV[3] -> maximum number of weights per queue
-- Returns: the number of weights of the queue.
-- Errors: RQ_TOO_MANY_WEIGHTS.
local weights, floor = KEYS[1], KEYS[2]
local vm, weight, max_weights = ARGV[1], ARGV[2], tonumber(ARGV[3])

if weight == '' then
  redis.call('HDEL', weights, vm)
else
  if redis.call('HEXISTS', weights, vm) == 0 and redis.call('HLEN', weights) >= max_weights then
    return redis.error_reply('RQ_TOO_MANY_WEIGHTS queue has the maximum number of weights')
  end
  redis.call('HSET', weights, vm, weight)
end
local n = redis.call('HLEN', weights)
-- The fair dequeue reads weights only when the floor says there are some.
local raw = redis.call('GET', floor)
if raw then
  local ttl = redis.call('PTTL', floor)
  local updated = string.gsub(raw, '|[^|]*$', '|' .. string.format('%d', n))
  if ttl > 0 then
    redis.call('SET', floor, updated, 'PX', ttl)
  else
    redis.call('SET', floor, updated)
  end
end
return n
