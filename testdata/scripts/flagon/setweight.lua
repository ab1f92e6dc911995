


-- Number x as a command argument: the string Redis makes of a Lua number
-- argument of redis.call ('%.17g'), made faster. '%.17g' takes a slow path
-- of the C library (about 0.5 us on Redis 7.0); for an integer below 2^53
-- in magnitude '%d' prints the same digits for a third of that (and -0 as
-- "0"). Anything else (a fraction, a huge value from a hand-edited key)
-- keeps '%.17g'. 0 and 1, the counts and ranks a call passes most, are
-- not formatted at all.
local function num_arg(x)
  if x == 0 then return '0' elseif x == 1 then return '1' end
  if x % 1 == 0 and x > -9007199254740992 and x < 9007199254740992 then return string.format('%d', x) end
  return string.format('%.17g', x)
end

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
  -- (in its value) or is parked (its idle score, tag - 2^52); a newcomer's
  -- in the lane ("w") was set by no serve and stays. The weight is rounded
  -- to milli-weights as lib/sched_reg's sched_milli does. One serve at m
  -- leaves a tag at most ceil(10^9 / m) above its start (the carried
  -- remainder adds up to a unit), so the cap takes no more than a serve at
  -- m could have left; (10^9 + m - 1) / m is exact once floored (its
  -- fraction is 0 or at least 1/m).
  local m = 1000
  if weight ~= '' then m = math.min(1000000, math.max(1, math.floor(tonumber(weight) * 1000 + 0.5))) end
  local limit = tonumber(st[1]) + math.floor((1000000000 + m - 1) / m)
  local hv = st[2]
  if hv then
    -- code, flag, gated tag; the remainder goes
    local code, flag, tag = string.match(hv, '^(%d+)([gw]?)(%d*)')
    if flag == 'g' and tag ~= '' and tonumber(tag) > limit then tag = num_arg(limit) end
    redis.call('HSET', state, vm, code .. flag .. tag)
    if flag == '' then
      local u = redis.call('ZSCORE', vtime, code .. vm)
      if u and u + 0 > limit then redis.call('ZADD', vtime, num_arg(limit), code .. vm) end
    end
  else
    local p = redis.call('ZSCORE', vtime, vm) -- (vm's member in the idle region only)
    if p and p + 0 < -3377699720527872 and p + 4503599627370496 > limit then
      redis.call('ZADD', vtime, num_arg(limit - 4503599627370496), vm)
    end
  end
end
return n
