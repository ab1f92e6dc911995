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
--@inline
local SCHED = { UNIT = 1000000, STRIDE = 1000000000, G = 4503599627370496, GS = '4503599627370496',
                W = 2251799813685248, ACTIVE_END = '(1125899906842624',
                IDLE_MIN = '-4503599627370496', IDLE_END = '(-3377699720527872',
                WAIT_MIN = '-2251799813685248', WAIT_END = '(-1125899906842624',
                SENTINEL = '0',
                WIDE_AT = 64, WIDE_SCORE = '2251799813685248',
                WIDE_MEMBER = 'runqueue scheduler: this member is longer than 64 bytes, see lib/sched',
                WIDE_FIELD = '~',
                WIDE_VALUE = 'runqueue scheduler: this value is longer than 64 bytes, see lib/sched.lua',
                REBASE_AT = 562949953421312, REBASE_BY = 281474976710656,
                REBASE_FLOOR = 140737488355328, READ_BUDGET = 1000,
                CODE_LEN = 15, VM_AT = 16 }

-- A score or scalar as stored: integers below 2^53 print exactly with 17
-- significant digits, on Redis and on gopher-lua alike (lib/record's
-- num_arg, which every script including this file includes first).
local function sched_fmt(x) return num_arg(x) end

-- The fixed-width code of registration number n (below 10^15): its byte
-- order is n's order.
local function sched_code(n)
  local s = sched_fmt(n)
  return string.rep('0', SCHED.CODE_LEN - #s) .. s
end

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

-- Call sites pass their keys and arguments explicitly.
-- (ttl_ms and idle_max are decimal strings from the client: x + 0 reads
-- such a string as a number for a sixth of what tonumber(x) costs on Redis
-- 7.0, which converts it twice. Only for strings this code or the client
-- wrote without leading zeros: gopher-lua, miniredis's Lua, reads '010' + 0
-- as octal. tonumber stays where a value may be missing, not a number, or
-- zero-padded, as a seq code is.)
local function sched_open(zkey, hkey, wkey, ttl_ms, idle_max, now)
  -- (every field it will hold, st to check: the table is sized once)
  return { z = zkey, h = hkey, w = wkey, ttl = ttl_ms + 0, idle_max = idle_max + 0, now = now,
           st = false, was = false, fresh = false, check = false, partial = false,
           renew = true }
end

local SCHED_FIELDS = { 'v', 'e', 'c', 's', 'x', 'gk', 'gn', 'gp', 'ng', 'nw', 'lh', 'b', 'cm' }
-- What a registration reads and writes of them (with x, which
-- sched_save reads), and the rest, read when a later step of the same
-- call asks for the whole state (see sched_state).
local SCHED_REG_FIELDS = { 'v', 's', 'x', 'nw', 'lh' }
local SCHED_REST_FIELDS = { 'e', 'c', 'gk', 'gn', 'gp', 'ng', 'b', 'cm' }

-- The scalars, read once per script. A missing state is created whole:
-- a stray ckVtime without its hash is dropped first, so V never restarts
-- under tags that outlived it. A hash without its ckVtime (deleted by hand
-- or evicted) is broken: with S.check (the hooks of the other scripts) the
-- sentinel is looked for here and the state starts again whole, so no
-- write remakes ckVtime without its sentinel and lifetime; the dequeue
-- finds it in its first read of the tags instead (sched_broken).
-- r, when given, is a reply that holds the values of fields (default
-- SCHED_FIELDS) from r[at + 1] (a caller that read them with another
-- field: see sched_register), and sentinel, when not nil, the sentinel's
-- score as read by the caller (false: missing). A state read with fewer
-- fields than SCHED_FIELDS is partial: the next sched_state(S) reads the
-- rest, so no caller of it sees a field that was not read.
local function sched_state(S, r, at, sentinel, fields)
  if S.st then
    if S.partial then
      -- A registration read only its fields: read the rest now, before
      -- any of them is used or changed.
      S.partial = false
      local rest = redis.call('HMGET', S.h, unpack(SCHED_REST_FIELDS))
      for i, f in ipairs(SCHED_REST_FIELDS) do
        local x = rest[i]
        if x then
          x = x + 0 -- (a decimal integer, as in the loop below)
          S.st[f], S.was[f] = x, x
        end
      end
    end
    return S.st
  end
  fields = fields or SCHED_FIELDS
  if not r then r, at = redis.call('HMGET', S.h, unpack(fields)), 0 end
  local st = { v = 0, e = 0, c = 0, s = 1, x = 0, gk = 0, gn = 1, gp = 0, ng = 0, nw = -1, lh = '', b = -1, cm = -1 }
  local broken = false
  if r[at + 1] and S.check then
    if sentinel == nil then sentinel = redis.call('ZSCORE', S.z, '') end
    broken = not sentinel
  end
  if not r[at + 1] or broken then
    redis.call('DEL', S.h, S.z)
    redis.call('ZADD', S.z, SCHED.SENTINEL, '')
    S.fresh = true
  else
    for i, f in ipairs(fields) do
      local x = r[at + i]
      if x then
        -- every scalar but lh is a decimal integer (sched_save writes them)
        if f == 'lh' then st.lh = x else st[f] = x + 0 end
      end
    end
    if st.lh == nil then st.lh = '' end
    S.partial = fields ~= SCHED_FIELDS
  end
  -- (the values as read: one field per SCHED_FIELDS entry, in a table
  -- built whole, not grown key by key)
  S.st = st
  S.was = { v = st.v, e = st.e, c = st.c, s = st.s, x = st.x, gk = st.gk, gn = st.gn, gp = st.gp,
            ng = st.ng, nw = st.nw, lh = st.lh, b = st.b, cm = st.cm }
  return st
end

-- Whether a dequeue renews a state whose deadline is x: half of its life
-- is gone by this writer's clock, or the deadline is further off than a
-- whole lifetime (written by a clock ahead of this one, or under a longer
-- StateTTL: Redis expires keys by its own clock).
local function sched_due(S, x)
  local left = x - S.now
  return left < S.ttl / 2 or left > S.ttl
end

-- Both keys live StateTTL from now.
local function sched_expire(S)
  redis.call('PEXPIRE', S.z, S.ttl)
  redis.call('PEXPIRE', S.h, S.ttl)
end

-- Write the scalars that changed, and refresh the lifetime of both keys
-- together when the state is new, or, in a dequeue (S.renew), when it is due
-- (sched_due). The hooks of the other scripts never extend
-- it: with flag-on writers and no flag-on dequeue (flag-off consumers,
-- or none), registrations that no dequeue collects would otherwise keep
-- the state, one entry per key ever made ready, for good; so the state
-- lives StateTTL past the last flag-on dequeue or its creation.
-- A call that changed nothing writes nothing.
local function sched_save(S)
  local st = S.st
  if not st then return end
  local refresh = S.fresh or (S.renew and sched_due(S, st.x))
  if refresh then st.x = S.now + S.ttl end
  local args = {}
  for _, f in ipairs(SCHED_FIELDS) do
    if S.fresh or st[f] ~= S.was[f] then
      args[#args + 1] = f
      if type(st[f]) == 'number' then args[#args + 1] = sched_fmt(st[f]) else args[#args + 1] = st[f] end
    end
  end
  if #args > 0 then redis.call('HSET', S.h, unpack(args)) end
  if refresh then sched_expire(S) end
end

-- A dequeue that stops at its capacity (the env or queue limit full)
-- reads no state, yet the queue is in use: it renews the state's life as
-- sched_save would (a read of x, and the writes only when they are due),
-- or a queue whose limits stay full for StateTTL would lose its state
-- while flag-on instances dequeue it. (The HSET may be the call's first
-- write, which a script run by EVALSHA on a full Redis is refused: the
-- call still answers, and the PEXPIREs, which add nothing, still renew.)
local function sched_keep(S)
  local x = tonumber(redis.call('HGET', S.h, 'x'))
  if not x then return end -- no state: nothing to keep
  if sched_due(S, x) then
    redis.pcall('HSET', S.h, 'x', sched_fmt(S.now + S.ttl))
    sched_expire(S)
  end
end

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

-- Milli-weight of variant vm: 1000 without a read when the queue has no
-- weights (st.nw counts them; -1: not known yet).
local function sched_weight(S, st, vm)
  if st.nw < 0 then st.nw = redis.call('HLEN', S.w) end
  if st.nw == 0 then return 1000 end
  return sched_milli(redis.call('HGET', S.w, vm))
end

-- A newcomer's quantum: one serve of its own at milli-weight m, at most
-- UNIT (a serve at weight 1).
local function sched_quantum(m)
  if m <= 1000 then return SCHED.UNIT end
  return (sched_div(SCHED.STRIDE, m))
end

-- The registration of a variant with no tag: u (nil when it queues in the
-- newcomer lane), code, waiting (in the lane), seq. A parked tag above V
-- makes it a return (at the parked tag); a parked tag at or below V is
-- worth nothing and goes; then a discovered variant starts at V, and a
-- newcomer queues behind the lane's head when the lane is not empty, else
-- with q its quantum and A = min(top, V + q) registers at V when A <= V,
-- or becomes the lane's head at A + q. parked, when not nil, is vm's idle
-- score as the caller read it (false: none). B, when given, holds the
-- writes of registrations not made yet (see sched_register_many in lib/sched): the
-- parked entry's removal goes there, and the top tag and ckVtime's size
-- count them.
local function sched_admit(S, st, vm, discovered, parked, B)
  if parked == nil then parked = redis.call('ZSCORE', S.z, vm) end
  if parked then
    if B then
      B.zrem[#B.zrem + 1] = vm
      B.delta = B.delta - 1
    else
      redis.call('ZREM', S.z, vm)
    end
  end
  local u, waiting = st.v, false
  if parked and num(parked) + SCHED.G > st.v then
    u = num(parked) + SCHED.G
  elseif not discovered then
    if st.lh ~= '' then
      u, waiting = nil, true
    else
      local top
      if B and B.top ~= nil then
        top = B.top
      else
        local t = redis.call('ZREVRANGEBYSCORE', S.z, SCHED.ACTIVE_END, '0', 'WITHSCORES', 'LIMIT', '0', '1')
        top = t[2] and num(t[2]) or false
        if B then B.top = top end
      end
      if B and B.pmax and (not top or B.pmax > top) then top = B.pmax end
      if top and top > st.v then
        local q = sched_quantum(sched_weight(S, st, vm))
        u, waiting = math.min(top, st.v + q) + q, true
        st.lh = vm
      end
    end
  end
  local seq = st.s
  st.s = st.s + 1
  if seq % SCHED.WIDE_AT == 0 and redis.call('ZCARD', S.z) + (B and B.delta or 0) >= SCHED.WIDE_AT then
    redis.call('ZADD', S.z, SCHED.WIDE_SCORE, SCHED.WIDE_MEMBER)
    redis.call('HSET', S.h, SCHED.WIDE_FIELD, SCHED.WIDE_VALUE)
  end
  return u, sched_code(seq), waiting, seq
end

-- Appends to z (ZADD arguments) the ckVtime entries of a registration
-- sched_admit made: its tag when it has one (competing, the lane's head
-- included) and its place in the lane when it waits there.
local function sched_entries(z, vm, u, code, waiting, seq)
  if u then
    z[#z + 1] = sched_fmt(u)
    z[#z + 1] = code .. vm
  end
  if waiting then
    z[#z + 1] = sched_fmt(seq - SCHED.W)
    z[#z + 1] = vm
  end
end

-- A variant gained its first ready run: register it unless it has a tag.
-- (Before the state is read, one HMGET reads the variant's registration
-- and the scalars together, and one ZMSCORE the sentinel and the
-- variant's parked tag; the registration is written with the scalars it
-- changed, which sched_save then leaves alone.)
local function sched_register(S, vm, discovered)
  local st, parked = S.st, nil
  if st then
    if redis.call('HEXISTS', S.h, vm) == 1 then return end
  else
    local r = redis.call('HMGET', S.h, vm, unpack(SCHED_REG_FIELDS))
    if r[1] then return end
    local z = redis.call('ZMSCORE', S.z, '', vm)
    st = sched_state(S, r, 1, z[1], SCHED_REG_FIELDS)
    parked = z[2]
    if S.fresh then parked = false end -- the state started again without it
  end
  local u, code, waiting, seq = sched_admit(S, st, vm, discovered, parked)
  local zargs = {}
  sched_entries(zargs, vm, u, code, waiting, seq)
  redis.call('ZADD', S.z, unpack(zargs))
  local hargs = { vm, sched_value(code, false, waiting, 0), 's', sched_fmt(st.s) }
  if st.lh ~= S.was.lh then
    hargs[5], hargs[6] = 'lh', st.lh
  end
  redis.call('HSET', S.h, unpack(hargs))
  S.was.s, S.was.lh = st.s, st.lh
end
