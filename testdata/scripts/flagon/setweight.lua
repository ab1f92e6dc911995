


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

-- The fair scheduler's state in Redis (flag on only): its layout, its
-- scalars, and registering a variant; lib/sched includes this file and
-- adds serving, draining and releasing. vtime/ is the model these
-- functions implement; see vtime/doc.go for the rules.
--
-- ckVtime ZSET, by score region (tags t are below 2^50; every value is an
-- exact integer of a double):
--   [-2^52, -2^52+2^50) idle: member = variant member, score = parked t - 2^52
--   [-2^51, -2^51+2^50) the newcomer lane: member = variant member, score =
--                       its registration number - 2^51 (a variant is never
--                       both parked and registered: the member cannot
--                       collide); its lowest is the head
--   [0, 2^50)           the sentinel member "" at score 0, always rank 0 of
--                       the region: the key lives exactly as long as the
--                       state hash (created, refreshed and expiring
--                       together), and the dequeue's first read of the
--                       region finds a ckVtime lost without its hash;
--                       competing: member = seq code .. variant member,
--                       score = t (the lane's head included); the seq code
--                       is the registration number as 15 decimal digits,
--                       so equal tags order by registration in the ZSET
--                       (bytes) and in Lua (compared as numbers: Lua's
--                       string "<" follows the server's locale)
--   2^51                the wide mark (SCHED.WIDE_MEMBER), once the key
--                       holds 64 entries (see below); no region reads it
--   [2^52, 2^52+2^50)   gated: the same members, score = 2^52 + the
--                       variant's gating number (the probe's order: later
--                       gated, later looked at); the tag is in the hash
-- state HASH: v (clock V, units), e (epoch), c (discovery cursor), s (next
--   registration number), x (refresh deadline, ms), gk (gating limit), gn
--   (next gating number), gp (the gating number the probe looked at last),
--   ng (gated variants), nw (weight overrides, -1 unknown), lh (the lane's
--   head, "" when the lane is empty), b (the time, ms, of the state's first
--   discovery read; -1 or missing until then: see dequeue_vtime's
--   discover), cm (the cold mark, ms: a promotion cut short on a cold
--   state; -1 or missing when unset: see dequeue_vtime's promote); and per
--   registered variant member:
--   its seq code, then "g" and its tag when gated or "w" when in the lane,
--   then "|r" when its stride remainder r is not 0; and, once ckVtime held
--   64 entries, the wide mark's field "~" (never read).
-- The wide marks: Redis stores a ZSET or HASH of at most 128 entries whose
-- members and values are all at most 64 bytes (the defaults of
-- zset-max-listpack-* and hash-max-listpack-*) as a listpack, which every
-- lookup, insert and range read walks from its start: at 100 keys that made
-- a flag-on dequeue cost about a third more Redis CPU than at 1,000. Every
-- 64th registration (registration numbers 64, 128, ...) looks at ckVtime's
-- size; when it holds 64 entries or more (tags, lane, gated, parked), one
-- member and one value of more than 64 bytes make Redis turn both keys
-- into a skiplist and a hash table for the rest of their lifetime. A state
-- that stays small (a key that drains and comes back registers again, but
-- adds no entry) stays compact: a listpack walk of a few dozen entries is
-- cheap, and a skiplist and a hash table cost about 1.6 KB more for one
-- key. A state that grows past 64 entries is widened within 64 further
-- registrations.
-- The build writes each SCHED.NAME of a script as its value and drops the
-- table (runqueue/inline.go): built at every call, it cost more Redis CPU
-- than the literals.

-- A score or scalar as stored: integers below 2^53 print exactly with 17
-- significant digits, on Redis and on gopher-lua alike (lib/record's
-- num_arg, which every script including this file includes first).
local function sched_fmt(x) return num_arg(x) end


-- A variant's state-hash value: { code, gated, tag (when gated), waiting, r }.
local function sched_parse(v)
  local code, f, t, r = string.match(v, '^(%d+)([gw]?)(%d*)|?(%d*)$')
  return { code = code, gated = f == 'g', tag = t ~= '' and t + 0 or nil, waiting = f == 'w',
           r = r ~= '' and r + 0 or 0 }
end

-- The value of a registration; a gated one carries its tag u.
local function sched_value(code, gated, waiting, r, u)
  local v = code
  if gated then v = v .. 'g' .. sched_fmt(u) end
  if waiting then v = v .. 'w' end
  if r > 0 then v = v .. '|' .. sched_fmt(r) end
  return v
end


local SCHED_FIELDS = { 'v', 'e', 'c', 's', 'x', 'gk', 'gn', 'gp', 'ng', 'nw', 'lh', 'b', 'cm' }
-- What a registration reads and writes of them (with x, which
-- sched_save reads), and the rest, read when a later step of the same
-- call asks for the whole state (see sched_state).
local SCHED_REG_FIELDS = { 'v', 's', 'x', 'nw', 'lh' }
local SCHED_REST_FIELDS = { 'e', 'c', 'gk', 'gn', 'gp', 'ng', 'b', 'cm' }






-- Milli-weight of a weight string (round half up, clamped to 1..10^6).
local function sched_milli(w)
  local x = tonumber(w)
  if not x then return 1000 end
  return math.min(1000000, math.max(1, math.floor(x * 1000 + 0.5)))
end

-- q, r of total / m, exact for integers below 2^53.
local function sched_div(total, m)
  local q = math.floor(total / m)
  if q * m > total then q = q - 1 elseif (q + 1) * m <= total then q = q + 1 end
  return q, total - q * m
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
  -- (in its value) or is parked (its idle score, tag - G); a newcomer's in
  -- the lane was set by no serve and stays. One serve at milli-weight m
  -- leaves a tag at most ceil(STRIDE / m) above its start (the carried
  -- remainder adds up to a unit), so the cap takes no more than a serve at
  -- m could have left.
  local q, r = sched_div(1000000000, sched_milli(weight))
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
    if p and p + 0 < -2251799813685248 and p + 4503599627370496 > limit then
      redis.call('ZADD', vtime, sched_fmt(limit - 4503599627370496), vm)
    end
  end
end
return n
