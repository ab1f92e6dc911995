-- setweight: set or clear the scheduler weight of one concurrency key.
--
-- KEYS[1] -> queue weights HASH (variant member -> weight)
-- KEYS[2] -> queue scheduler state HASH (see lib/sched: its nw field counts
--            the weights; the key's stride remainder is of the old weight)
-- ARGV[1] -> variant member
-- ARGV[2] -> weight (0.001..1000, checked by the caller), "" to clear
-- ARGV[3] -> maximum number of weights per queue
-- Returns: the number of weights of the queue.
-- Errors: RQ_TOO_MANY_WEIGHTS.
local weights, state = KEYS[1], KEYS[2]
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
-- The fair dequeue reads weights only when the state says there are some.
-- The hash keeps its TTL: HSET on an existing field does not touch it.
if redis.call('HEXISTS', state, 'v') == 1 then
  redis.call('HSET', state, 'nw', n)
  local hv = redis.call('HGET', state, vm)
  if hv then
    local kept = string.match(hv, '^(%d+[gw]?%d*)') -- the code, flag and gated tag: the remainder goes
    redis.call('HSET', state, vm, kept)
  end
end
return n
