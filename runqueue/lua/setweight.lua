-- setweight: set or clear the scheduler weight of one concurrency key.
--
-- KEYS[1] -> queue weights HASH (variant member -> weight)
-- KEYS[2] -> queue scheduler state HASH (see lib/sched_reg: its nw field
--            counts the weights; the key's stride remainder is of the old
--            weight)
-- KEYS[3] -> queue ckVtime ZSET (see lib/sched_reg)
-- ARGV[1] -> variant member
-- ARGV[2] -> weight (0.001..1000, checked by the caller), "" to clear
-- ARGV[3] -> maximum number of weights per queue
-- Returns: the number of weights of the queue.
-- Errors: RQ_TOO_MANY_WEIGHTS.
--@include record
--@include sched_reg
local weights, state, vtime = KEYS[1], KEYS[2], KEYS[3]
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
-- The hash keeps its TTL: HSET on an existing field does not touch it, nor
-- does ZADD on an existing member.
local st = redis.call('HMGET', state, 'v', vm)
if st[1] then
  redis.call('HSET', state, 'nw', n)
  -- The new weight caps what the key owes for its serves at the old one
  -- (vtime's SetWeight): a tag above V plus one serve at the new weight
  -- comes down to it, whether it competes (its ckVtime score), is gated
  -- (in its value) or is parked (its idle score, tag - G); a newcomer's in
  -- the lane was set by no serve and stays. One serve at milli-weight m
  -- leaves a tag at most ceil(STRIDE / m) above its start (the carried
  -- remainder adds up to a unit), so the cap takes no more than a serve at
  -- m could have left.
  local q, r = sched_div(SCHED.STRIDE, sched_milli(weight))
  if r > 0 then q = q + 1 end
  local limit = tonumber(st[1]) + q
  if st[2] then
    local rg = sched_parse(st[2]) -- (the remainder, of the old weight, goes)
    local tag = rg.tag
    if rg.gated and tag > limit then tag = limit end
    redis.call('HSET', state, vm, sched_value(rg.code, rg.gated, rg.waiting, 0, tag))
    if not rg.gated and not rg.waiting then
      local u = redis.call('ZSCORE', vtime, rg.code .. vm)
      if u and u + 0 > limit then redis.call('ZADD', vtime, sched_fmt(limit), rg.code .. vm) end
    end
  else
    local p = redis.call('ZSCORE', vtime, vm) -- (below the lane region: parked)
    if p and p + 0 < -SCHED.W and p + SCHED.G > limit then
      redis.call('ZADD', vtime, sched_fmt(limit - SCHED.G), vm)
    end
  end
end
return n
