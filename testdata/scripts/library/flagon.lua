#!lua name=runqueue_31092a987506af41
-- runqueue's flag-on scripts as one library (see runqueue/library.go).
local KEYS, ARGV
-- A run's record is one field of the queue's runs HASH, built by Go
-- (runqueue/record.go): "ttl|att|pr|at|lt|vm|" then the payload's bytes.
--   ttl  expiry deadline (ms), 0 for none: first, so that one byte tells
--        whether the run has one (rec_has_ttl). It binds only until the
--        first delivery: the dequeue removes the run's ttl entry but does
--        not rewrite the record; every later rewrite (rec_with) clears it.
--   att  attempt number of the next (or current) delivery, from 1
--   pr   priority 0..9
--   at   available_at (ms)
--   lt   delivery token of the delivery whose nack settled the run's
--        current stay (0: none; a lease recovery and a redrive write 0): a
--        retried nack finds its answer there
--   vm   variant member ("=" + encoded concurrency key)
-- A run's state is where it is: a variant's ready or delayed set, the
-- queue's held hash (in flight), or the queue's dead set. The fields stay
-- strings unless a script computes with them; the dequeue does not parse
-- records at all.
local function rec_parse(s)
  local ttl, att, pr, at, lt, vm, pos = string.match(s, '^(%d+)|(%d+)|(%d)|(%d+)|(%d+)|([^|]*)|()')
  return { att = tonumber(att), pr = tonumber(pr), at = at, ttl = ttl, lt = lt, vm = vm, pos = pos }
end

-- The record r after a delivery (nack, lease recovery, redrive): new att,
-- at and lt, no TTL, and the same pr, vm and payload.
local function rec_with(s, r, att, at, lt)
  return '0|' .. att .. '|' .. r.pr .. '|' .. at .. '|' .. lt .. '|' .. r.vm .. '|' .. string.sub(s, r.pos)
end

-- Whether record s has a TTL (its first field is not "0").
local function rec_has_ttl(s)
  return string.byte(s, 1) ~= 48
end

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

-- A number Redis returned as a string (a score), or nil for a missing one
-- (false or nil). Arithmetic reads the string once; tonumber reads it twice
-- on Redis 7.0's Lua (about 1,400 instructions against 500), and a score
-- is read for every variant a dequeue looks at. Every score Redis prints
-- reads so (digits, "inf", "-inf"), and so does every score miniredis
-- prints ("1e+08") in gopher-lua, whose arithmetic parses it as a float.
-- The scripts read the integers the client writes in their arguments
-- (decimal, no leading zero: gopher-lua reads "010" + 0 as octal) the same
-- way, x + 0; tonumber stays where a value may be missing or not a number.
local function num(s)
  if not s then return nil end
  return s + 0
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

-- The fixed-width code of registration number n (below 10^15): its byte
-- order is n's order.
local function sched_code(n)
  local s = sched_fmt(n)
  return string.rep('0', 15 - #s) .. s
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
    redis.call('ZADD', S.z, '0', '')
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
  if m <= 1000 then return 1000000 end
  return (sched_div(1000000000, m))
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
  if parked and num(parked) + 4503599627370496 > st.v then
    u = num(parked) + 4503599627370496
  elseif not discovered then
    if st.lh ~= '' then
      u, waiting = nil, true
    else
      local top
      if B and B.top ~= nil then
        top = B.top
      else
        local t = redis.call('ZREVRANGEBYSCORE', S.z, '(1125899906842624', '0', 'WITHSCORES', 'LIMIT', '0', '1')
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
  if seq % 64 == 0 and redis.call('ZCARD', S.z) + (B and B.delta or 0) >= 64 then
    redis.call('ZADD', S.z, '2251799813685248', 'runqueue scheduler: this member is longer than 64 bytes, see lib/sched')
    redis.call('HSET', S.h, '~', 'runqueue scheduler: this value is longer than 64 bytes, see lib/sched.lua')
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
    z[#z + 1] = sched_fmt(seq - 2251799813685248)
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
-- The fair scheduler's state in Redis (flag on only): lib/sched_reg (the
-- layout, the state's scalars, registration) and the rest of what the
-- scripts that serve, drain and release variants do. vtime/ is the model
-- these functions implement; see vtime/doc.go for the rules.

-- The variant member and the code of a competing or gated member.
local function sched_split(member)
  return string.sub(member, 16), string.sub(member, 1, 15)
end

-- The lane's member after the first `after` (0-based rank), or nil.
local function sched_lane_at(S, after)
  return redis.call('ZRANGEBYSCORE', S.z, '-2251799813685248', '(-1125899906842624', 'LIMIT', after, '1')[1]
end

-- Drop parked tags at or below v (worth nothing), then all but the highest
-- idle_max (the idle region holds the lowest scores: ranks from 0).
local function sched_reap(S, v)
  redis.call('ZREMRANGEBYSCORE', S.z, '-4503599627370496', sched_fmt(v - 4503599627370496))
  local n = redis.call('ZCOUNT', S.z, '-4503599627370496', '(-3377699720527872')
  if n > S.idle_max then redis.call('ZREMRANGEBYRANK', S.z, '0', n - S.idle_max - 1) end
end

-- A state whose ckVtime went without its hash (deleted by hand, evicted):
-- the dequeue found no sentinel in its first read of the competing region.
-- Both keys go: the next call starts the state again, as if it had
-- expired, and finds every variant with ready work by discovery.
local function sched_broken(S)
  redis.call('DEL', S.h, S.z)
  S.st = nil
end

-- A variant's last ready run left outside a dequeue: it leaves the
-- competition (and the lane: a head that leaves unserved hands its tag to
-- the next newcomer), its tag parked when above V.
local function sched_drained(S, vm)
  local hv = redis.call('HGET', S.h, vm)
  if not hv then return end
  local st = sched_state(S)
  -- A state started again (sched_state found no clock): nothing is
  -- registered. (No script registers a variant before it drains or
  -- releases one.)
  if S.fresh then return end
  local rg = sched_parse(hv)
  local member = rg.code .. vm
  local u
  if rg.gated then
    u = rg.tag
    st.ng = st.ng - 1
  else
    u = num(redis.call('ZSCORE', S.z, member)) -- nil when queued in the lane
  end
  redis.call('HDEL', S.h, vm)
  redis.call('ZREM', S.z, member, vm)
  if rg.waiting and st.lh == vm then
    st.lh = ''
    local nxt = sched_lane_at(S, 0)
    if nxt then
      local nv = sched_parse(redis.call('HGET', S.h, nxt))
      redis.call('ZADD', S.z, sched_fmt(math.max(st.v, u or st.v)), nv.code .. nxt)
      st.lh = nxt
    end
  end
  if u and u > st.v then
    redis.call('ZADD', S.z, sched_fmt(u - 4503599627370496), vm)
    sched_reap(S, st.v)
  end
end

-- Run cmd key with args in chunks of at most 1000 (Redis Lua refuses to
-- unpack much more than 8,000 values), step values at a time.
local function sched_chunked(cmd, key, args, step)
  local n = step * math.floor(1000 / step)
  for i = 1, #args, n do
    redis.call(cmd, key, unpack(args, i, math.min(i + n - 1, #args)))
  end
end

-- A read of key by any number of fields or members (HMGET, ZMSCORE), in
-- chunks of 1000 (unpack's limit). Up to 1000, the reply itself (false for
-- a missing one), not a copy.
local function sched_mread(cmd, key, fields)
  if #fields == 0 then return {} end
  if #fields <= 1000 then return redis.call(cmd, key, unpack(fields)) end
  local out = {}
  for i = 1, #fields, 1000 do
    local part = redis.call(cmd, key, unpack(fields, i, math.min(i + 999, #fields)))
    for j = 1, #part do out[i + j - 1] = part[j] end
  end
  return out
end

local function sched_hmget(h, fields) return sched_mread('HMGET', h, fields) end

-- A batch of registrations (sched_register_many, the dequeue's
-- discovery): their writes gathered, and what the later ones must see of
-- the earlier ones (the top tag a newcomer compares with V: B.pmax over
-- B.top, read once; ckVtime's size: B.delta).
local function sched_batch()
  return { zrem = {}, zadd = {}, hset = {}, delta = 0, top = nil, pmax = false }
end

-- Registers vm, which has no tag (p: its parked tag, or false), into
-- batch B, as sched_register would.
local function sched_admit_into(S, st, vm, discovered, p, B)
  local u, code, waiting, seq = sched_admit(S, st, vm, discovered, p, B)
  sched_entries(B.zadd, vm, u, code, waiting, seq)
  if u then
    B.delta = B.delta + 1
    if not B.pmax or u > B.pmax then B.pmax = u end
  end
  if waiting then B.delta = B.delta + 1 end
  local h = B.hset
  h[#h + 1] = vm
  h[#h + 1] = sched_value(code, false, waiting, 0)
end

-- Variants that gained their first ready run, in order (a script's hooks
-- gather them: see hooks_vtime): what sched_register(S, vm, false) does
-- for each in turn, with one HMGET and one ZMSCORE for all of them before
-- and their writes in one ZREM, ZADD and HSET after. In between, nothing
-- reads what they write but the registrations themselves, and those see
-- it: the lane's head (st.lh), the top tag a newcomer compares with V (the
-- tags registered before it count: B.pmax) and ckVtime's size (B.delta);
-- a variant named twice registers once, as its second call would find it
-- registered. A state started again (sched_state found none, or found it
-- broken) drops what was read of it before: every variant after that is
-- unregistered and has no parked tag. vms may also be one variant member,
-- a string (most calls make one variant ready, and pay for no list).
-- found, when given, holds the variants that register as discovered ones,
-- at V (the dequeue's promotion: the cold mark).
local function sched_register_many(S, vms, found)
  if type(vms) == 'string' then
    sched_register(S, vms, false)
    return
  end
  found = found or {}
  local k = #vms
  if k == 1 or k > 1000 then
    -- (more than the reads' arguments may be: one at a time; only a
    -- dequeue's promotion gathers that many, when more than 1,000 keys'
    -- delayed runs fall due at once and ScanLimit lets it promote them)
    for i = 1, k do sched_register(S, vms[i], found[vms[i]] or false) end
    return
  end
  local st, regs, parked, off = S.st, nil, nil, 0
  if st then
    regs = redis.call('HMGET', S.h, unpack(vms))
    parked = redis.call('ZMSCORE', S.z, unpack(vms))
  else
    local args = {}
    for i = 1, k do args[i] = vms[i] end
    for i, f in ipairs(SCHED_REG_FIELDS) do args[k + i] = f end
    regs = redis.call('HMGET', S.h, unpack(args))
    parked = redis.call('ZMSCORE', S.z, '', unpack(vms))
    off = 1
  end
  local B = sched_batch()
  local seen, void, n = {}, false, 0
  for i = 1, k do
    local vm = vms[i]
    if not seen[vm] then
      seen[vm] = true
      if void or not regs[i] then
        if not st then
          st = sched_state(S, regs, k, parked[1], SCHED_REG_FIELDS)
          if S.fresh then
            -- (the state started again: the variants seen before this
            -- one were found registered in the state that is gone)
            void, seen = true, { [vm] = true }
          end
        end
        local p = false
        if not void then p = parked[i + off] end
        sched_admit_into(S, st, vm, found[vm] or false, p, B)
        n = n + 1
      end
    end
  end
  if n == 0 then return end
  sched_chunked('ZREM', S.z, B.zrem, 1)
  sched_chunked('ZADD', S.z, B.zadd, 2)
  local h = B.hset
  h[#h + 1] = 's'
  h[#h + 1] = sched_fmt(st.s)
  if st.lh ~= S.was.lh then
    h[#h + 1] = 'lh'
    h[#h + 1] = st.lh
  end
  sched_chunked('HSET', S.h, h, 2)
  S.was.s, S.was.lh = st.s, st.lh
end

-- A hooks table for a step that only makes variants ready (the dequeue's
-- promotion): it gathers them in order, in its own list part, for
-- sched_register_many.
local function sched_gather_ready_start(G, vm) G[#G + 1] = vm end
local function sched_gather() return { ready_start = sched_gather_ready_start } end

-- Slots of the variants vms freed (ack, nack, lease recovery, dead
-- letter, a dequeue's runs expired): a gated one competes again, at
-- max(S, V), whatever the key limit is now (one read for all of them).
-- own: the caller is a dequeue, which may have started the state and
-- gated variants in it itself.
local function sched_released(S, vms, own)
  local hvs = sched_hmget(S.h, vms)
  for i, vm in ipairs(vms) do
    local rg = hvs[i] and sched_parse(hvs[i])
    if rg and rg.gated then
      local st = sched_state(S)
      if S.fresh and not own then return end -- a state started again: see sched_drained
      local u, r = rg.tag, rg.r
      if not u or u < st.v then u, r = st.v, 0 end
      redis.call('ZADD', S.z, sched_fmt(u), rg.code .. vm)
      redis.call('HSET', S.h, vm, sched_value(rg.code, false, false, r))
      st.ng = st.ng - 1
    end
  end
end

-- The hooks of the scripts that move runs (see hooks_vtime). look: a
-- freed slot looks for a gated variant (see hooks_vtime); when it does
-- not, there is none to find, or the dequeue's un-gating comes first.
-- (Methods over the hooks' own table, called hooks:name(...), so that a
-- call makes one table and no closures.)
local function sched_hook_ready_start_many(H, vms) sched_register_many(H.S, vms) end
local function sched_hook_ready_empty(H, vm) sched_drained(H.S, vm) end
local function sched_hook_released(H, vms) if H.look then sched_released(H.S, vms) end end
local function sched_hook_finish(H) sched_save(H.S) end
local function sched_hooks(S, look)
  return { S = S, look = look, ready_start_many = sched_hook_ready_start_many,
           ready_empty = sched_hook_ready_empty, released = sched_hook_released, finish = sched_hook_finish }
end
-- An env's waiting line (layout 8): the queues of an env with a limit that
-- wait for its slots, read and woken (lib/envwait keeps the marks: what a
-- mark is, when a dequeue writes one, when one is live, leaving or dead).
-- A ZSET (member: a queue's member, score: its place) and a HASH beside
-- it (the queue's member -> its mark, "till:limit": the time the mark
-- lives until, in ms of Redis's TIME, and the env limit the queue's
-- consumer gave (layout 9); "#" -> the last place given; "^" -> the
-- highest limit a mark was written with since the line was made). Included by
-- lib/envwait and by lib/hooks_vtime, whose acks and requeues wake the
-- line for the slots they free.
--
-- The env's queues may be given different env limits (Config.LimitsFor):
-- a mark is left a slot only while the env's count is below its own
-- limit, and the marks left slots together must all be able to use them
-- (each one's limit above the count plus their number), so a queue held
-- by its own lower limit neither keeps the slots from a queue behind it
-- that could use them, nor is left one that another's serves would fill;
-- and a call whose own limit leaves it nothing more wakes a mark behind it
-- that a higher limit leaves a slot ("^" tells whether one may).

local EW_WAKE_MAX = 16

local function ew_open(line, lives, wake, life, grace, dq)
  return { line = line, lives = lives, wake = wake, life = life + 0, grace = grace + 0, dq = dq,
    now = nil,     -- TIME (ms), read once a mark is to be read or written
    mine = nil,    -- this queue's live place
    till = 0,      -- and the life of its mark then
    count = 0,     -- ew_capacity: the env's count the slots are counted from,
    ahead = 0,     -- the marks ahead left a slot,
    lowest = math.huge, -- and the lowest of their limits
    top = nil,     -- the line's "^", once read
    seen = 0, whole = false, -- ew_live: the highest limit met; read to the end
    room = 0, held = false,
    lazy = false } -- the line was empty: the held test waits for ew_settle
end

local function ew_time(ew)
  if ew.now == nil then
    local t = redis.call('TIME')
    ew.now = t[1] * 1000 + math.floor(t[2] / 1000)
  end
  return ew.now
end

-- A write that may be refused on a full Redis: nil then.
local function ew_write(...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then return nil end
  return r
end

-- The env's runs in flight now.
local function ew_count(dq)
  return tonumber(redis.call('GET', dq.env_n)) or 0
end

-- A mark's life and env limit from its value ("till:limit"); nil for one
-- not so written (a hand edit): dead.
local function ew_mark(v)
  if not v then return nil end
  local till, lim = string.match(v, '^(%d+):(%d+)$')
  if not till then return nil end
  return till + 0, lim + 0
end

local function ew_drop(ew, members)
  redis.call('ZREM', ew.line, unpack(members))
  redis.call('HDEL', ew.lives, unpack(members))
  if redis.call('ZCARD', ew.line) == 0 then
    redis.call('DEL', ew.line, ew.lives)
    ew.top = 0 -- (the line and its "^" are gone: a mark written now makes them)
  end
end

-- Up to n live marks of the line with a place in (lo, hi], in place
-- order, that can use the env's slots counted from count: a mark is taken
-- when its limit and those of the marks taken before it (and lowest, the
-- lowest limit of marks already left slots, if any) are all above count
-- plus their number with it. It passes over the leaving marks and those
-- that cannot, and drops the dead ones met (at most 4 reads). It returns
-- the marks and the lowest of their limits and lowest (math.huge for
-- none).
local function ew_live(ew, lo, hi, n, count, lowest)
  local now = ew_time(ew)
  local out, passed = {}, 0
  lowest = lowest or math.huge
  ew.seen, ew.whole = 0, false
  for _ = 1, 4 do
    if #out >= n then break end
    -- (a read asks for as many more as it passed marks, which stay, the
    -- leaving ones above all: else a few of them use up the reads before
    -- the live ones behind, 4 at one free slot: helper-206)
    local want = n - #out + passed
    local batch = redis.call('ZRANGEBYSCORE', ew.line, lo, hi, 'LIMIT', #out + passed, want)
    if #batch == 0 then ew.whole = true break end
    local lives = redis.call('HMGET', ew.lives, unpack(batch))
    local dead = {}
    for i, m in ipairs(batch) do
      local till, lim = ew_mark(lives[i])
      if not till or till < now then
        dead[#dead + 1] = m
      else
        if lim > ew.seen then ew.seen = lim end
        if till - now > ew.grace and #out < n and math.min(lowest, lim) > count + #out then
          out[#out + 1], lowest = m, math.min(lowest, lim)
        else
          passed = passed + 1
        end
      end
    end
    if #dead > 0 then ew_drop(ew, dead) end
    if #batch < want then ew.whole = true break end
  end
  return out, lowest
end

-- Wakes up to n live marks with a place in (lo, hi] that can use the
-- env's slots counted from count (ew_live, with lowest; at most
-- EW_WAKE_MAX) and returns how many it found, and the lowest limit: the
-- env's free slots go to them.
local function ew_wake_live(ew, lo, hi, n, count, lowest)
  local marks
  marks, lowest = ew_live(ew, lo, hi, n, count, lowest)
  for i = 1, math.min(#marks, EW_WAKE_MAX) do redis.call('PUBLISH', ew.wake, marks[i]) end
  return #marks, lowest
end

-- The line's "^" (0 for none), read once a call.
local function ew_top(ew)
  if ew.top == nil then ew.top = tonumber(redis.call('HGET', ew.lives, '^')) or 0 end
  return ew.top
end

-- A wake-up of one mark by the marks' own limits (a release or acks whose
-- own queue's limit leaves no slot free), when "^" is above the count:
-- else none can take one. A read of the whole line to its end
-- lowers "^" to the highest limit it met (an env limit lowered for every
-- queue: else "^" stays above the count, and each such release, and each
-- call of a waiting queue that its own limit holds, reads the line for
-- nothing while it lives).
local function ew_wake_one(ew, count)
  if ew_top(ew) <= count then return end
  ew_wake_live(ew, '-inf', '+inf', 1, count)
  if ew.whole and ew.seen > 0 and ew.seen < ew.top and ew_write('HSET', ew.lives, '^', ew.seen) then
    ew.top = ew.seen
  end
end
-- Scheduler flag on: the hooks keep each variant's registration (see
-- sched). A script that includes "hooks" calls
--   hooks_open(KEYS, ARGV, own_keys, own_args, now)
-- where own_keys and own_args count the script's own KEYS and ARGV; the
-- flag-on build appends these after them:
--   KEYS[own_keys+1] -> queue ckVtime ZSET (see sched)
--   KEYS[own_keys+2] -> queue scheduler state HASH (see sched)
--   KEYS[own_keys+3] -> queue weights HASH (variant member -> weight)
--   ARGV[own_args+1] -> scheduler state TTL (ms)
--   ARGV[own_args+2] -> idle set cap
--   ARGV[own_args+3] -> 1 when a freed slot looks for a gated variant: the
--                       queue has a per-key limit now, or the instance
--                       gave one to a queue before (the limit may have
--                       gone and come back since the variant was gated)
-- and, from a script that frees the env's slots (ack, requeue) of a queue
-- with an env limit, the env's waiting line (see envline):
--   KEYS[own_keys+4] -> the env's in-flight counter
--   KEYS[own_keys+5] -> the env's waiting line ZSET
--   KEYS[own_keys+6] -> the line's HASH of lives and places
--   ARGV[own_args+4] -> the env limit
--   ARGV[own_args+5] -> the shard's wake-up channel
--   ARGV[own_args+6] -> the leaving grace (ms)
--
-- The scheduler's code is defined inside hooks_lib(), at the first hook that
-- does something: Redis runs a script's whole body at every call, and most
-- calls of these scripts (an enqueue behind a variant's head, an ack
-- without a key limit) need none of it, so they do not pay for making its
-- closures and tables.
local function hooks_lib(H)
  if not H.h then
    H.h = (function()
      local S = sched_open(H.keys[H.own_keys + 1], H.keys[H.own_keys + 2], H.keys[H.own_keys + 3],
                           H.args[H.own_args + 1], H.args[H.own_args + 2], H.now)
      S.check = true -- look for the sentinel (see sched_state)
      S.renew = false -- only a dequeue keeps the state alive (see sched_save)
      return sched_hooks(S, H.look)
    end)()
  end
  return H.h
end

-- The hooks are methods over the table hooks_open returns (hooks:name(...)),
-- so that a call makes that one table and no closures.
-- A variant that gains its first ready run is registered later, with the
-- others of the call (sched_register_many: one read and one write for
-- all of them): before any other hook, and at finish. Nothing the script
-- does in between reads the scheduler's keys. Every script that calls a
-- hook calls finish after it.
-- (H.pend: false, one variant member, or a list of them: most calls make
-- one variant ready at most, and pay for no list; sched_register_many
-- takes either.)
local function hooks_flush(H)
  local p = H.pend
  H.pend = false
  hooks_lib(H):ready_start_many(p)
end
local function hooks_ready_start(H, vm)
  local p = H.pend
  if not p then
    H.pend = vm
  elseif type(p) == 'string' then
    H.pend = { p, vm }
  else
    p[#p + 1] = vm
  end
end
local function hooks_ready_empty(H, vm)
  if H.pend then hooks_flush(H) end
  hooks_lib(H):ready_empty(vm)
end
local function hooks_released(H, vms)
  H.freed = true
  if H.look then
    if H.pend then hooks_flush(H) end
    hooks_lib(H):released(vms)
  end
end
-- A call that freed slots of an env with a limit wakes the live marks of
-- its waiting line the free slots now go to (up to one a free slot, in
-- line order, the call's own queue's too), as a dequeue of the env does;
-- the free slots are the call's queue's limit's, but a mark is woken by
-- its own limit: where a queue with a higher limit waits, a call whose
-- lower limit leaves no free slot still wakes one.
-- Without it a slot a plain ack or nack freed stayed idle until the next
-- dequeue of any queue of the env or the waiting queue's poll. (The code
-- is made only then: most calls have no env limit.)
local function hooks_finish(H)
  if H.pend then hooks_flush(H) end
  if H.h then H.h:finish() end
  -- (H.freed: set by hooks_released; the line's arguments follow the
  -- hooks' only then: fields left out of hooks_open's table, which every
  -- flag-on enqueue makes)
  if H.freed and H.args[H.own_args + 4] ~= nil and redis.call('EXISTS', H.keys[H.own_keys + 5]) == 1 then
    (function(k, a)
      local dq = { env_limit = a[H.own_args + 4] + 0, env_n = k[H.own_keys + 4] }
      local count = ew_count(dq)
      local ew = ew_open(k[H.own_keys + 5], k[H.own_keys + 6], a[H.own_args + 5], 0, a[H.own_args + 6], dq)
      if dq.env_limit - count > 0 then
        ew_wake_live(ew, '-inf', '+inf', dq.env_limit - count, count)
      else -- (none free by its own limit: one, if a mark's limit leaves it one)
        ew_wake_one(ew, count)
      end
    end)(H.keys, H.args)
  end
end

local function hooks_open(keys, args, own_keys, own_args, now)
  -- Effects replication, before the first write, when the call may read
  -- the env's line after its release (hooks_finish: TIME, then the drop of
  -- dead marks): Redis 6.2 run with lua-replicate-commands no refuses every
  -- write after TIME, which would fail the release after its writes
  -- (helper-208). Redis 7 always replicates effects (a no-op there).
  if args[own_args + 4] ~= nil and redis.replicate_commands then redis.replicate_commands() end
  return { keys = keys, args = args, own_keys = own_keys, own_args = own_args, now = now,
           look = args[own_args + 3] == '1', h = false, pend = false,
           ready_start = hooks_ready_start, ready_empty = hooks_ready_empty,
           released = hooks_released, finish = hooks_finish }
end
-- Wide sets. Redis keeps a sorted set of at most 128 members
-- (zset-max-listpack-entries) of at most 64 bytes each as a listpack, which
-- a ZADD walks from its start to find the member and again to find its
-- place; a queue's ckIndex of 64 to 128 keys and a variant's ready set of
-- 64 to 128 runs cost every write there more than a skiplist would
-- (callgrind on Redis 7.0.15, 100 keys: a dequeue at batch 10 spent 15% of
-- its instructions in ckIndex's walks, a bulk enqueue of 100 runs per key
-- about a third in the ready sets', a worker's fused ack-and-dequeue with
-- 100 runs in flight 13-17% in the leases'). widen gives such a set a
-- member of more than 64 bytes and removes it again in the same script:
-- Redis turns the set into a skiplist at the ZADD and keeps it one after
-- the ZREM (it turns a skiplist back into a listpack only when it writes a
-- new set: ZRANGESTORE, ZUNIONSTORE, loading a dump), so no reader sees the
-- member and the stored data is what it was. (ZADD NX: a member of that
-- name, which no index or set holds, would be left alone.) The sets looked
-- at: a variant's ready or delayed set and the index of its kind (ckIndex,
-- delayIndex) when a call places runs there and takes the queue's depth
-- count of that kind past a multiple of 64 (place_count, place_flush);
-- ckIndex and the shard's leases (its runs in flight) when a dequeue takes
-- the shard's token counter past one. The queue's runs hash too, at both
-- (widen: the same for a hash).

-- Look at sorted sets zs (a list) and hash h (nil: none): make each set
-- of WIDE.AT to WIDE.TO members a skiplist (above that Redis has made it
-- one, at its default configuration), and h a hash table when it holds
-- WIDE.AT to WIDE.HASH_TO fields. (Redis keeps a hash of at most 512
-- fields, hash-max-listpack-entries, of at most 64 bytes each as a
-- listpack, as a queue's runs hash is with payloads under about 25 bytes;
-- a field of more than 64 bytes, set and deleted again, turns it into a
-- hash table for good.) One function for both: a script makes a closure
-- of each function it defines at every call.
local function widen(zs, h)
  for _, z in ipairs(zs) do
    local n = redis.call('ZCARD', z)
    if n >= 64 and n <= 128 and redis.call('ZADD', z, 'NX', '0', '~runqueue: a name of more than 64 bytes turns a listpack into a skiplist or hash table') == 1 then
      redis.call('ZREM', z, '~runqueue: a name of more than 64 bytes turns a listpack into a skiplist or hash table')
    end
  end
  if h then
    local n = redis.call('HLEN', h)
    if n >= 64 and n <= 512 and redis.call('HSETNX', h, '~runqueue: a name of more than 64 bytes turns a listpack into a skiplist or hash table', '1') == 1 then
      redis.call('HDEL', h, '~runqueue: a name of more than 64 bytes turns a listpack into a skiplist or hash table')
    end
  end
end

-- The queue's depth count of field ('r' ready, 'd' delayed) went up by k
-- to n: when it passed a multiple of WIDE.AT, widen the sets of that kind
-- the call placed runs in, the index of that kind and the runs hash. set
-- is the one set the call placed runs in, or a counting memo (see
-- place_memo): then the sets it placed WIDE.EACH runs or more in, else its
-- last run's, so that a call of runs of many keys reads a few sets, not one
-- per key (a ZCARD is a small part of WIDE.EACH runs' cost).
local function place_widen(q, field, n, k, set)
  if k < 64 and n % 64 >= k then return end
  local sets = {}
  if type(set) == 'string' then
    sets[1] = set
  else
    local memo = set
    for _, z in ipairs(memo.sets[field]) do
      local runs = memo.args and #memo.args[z] / 2 or memo.seen[z]
      if runs >= 4 then sets[#sets + 1] = z end
    end
    if #sets == 0 then sets[1] = memo.last[field] end
  end
  if field == 'r' then sets[#sets + 1] = q.ck_index else sets[#sets + 1] = q.delay_index end
  widen(sets, q.runs)
end

-- Recompute the queue's score in the shard master ZSET: the earliest time it
-- has work (lowest ready head score, or earliest delayed available_at).
-- dhead and chead are delayIndex's and ckIndex's lowest scores when the
-- caller knows them (false: the index is empty), nil to read them.
local function master_refresh(ck_index, delay_index, master, qm, dhead, chead)
  if chead == nil then
    local r = redis.call('ZRANGE', ck_index, '0', '0', 'WITHSCORES')
    chead = r[2] and num(r[2]) or false
  end
  if dhead == nil then
    local d = redis.call('ZRANGE', delay_index, '0', '0', 'WITHSCORES')
    dhead = d[2] and num(d[2]) or false
  end
  local best = chead or nil
  if dhead and (best == nil or dhead < best) then best = dhead end
  if best == nil then
    redis.call('ZREM', master, qm)
  else
    redis.call('ZADD', master, best, qm)
  end
end

-- Take n queued runs off the depth counter field ('r' or 'd'). When the
-- queue then holds no queued run, the counters are deleted, so a queue whose
-- last run is acked, dead-lettered or expired leaves no key behind.
local function depth_sub(depth, field, n)
  if redis.call('HINCRBY', depth, field, num_arg(-n)) > 0 then return end
  local other = 'd'
  if field == 'd' then other = 'r' end
  if (tonumber(redis.call('HGET', depth, other)) or 0) <= 0 then redis.call('DEL', depth) end
end

-- The keys of variant vm of the queue whose variant keys start with vbase
-- (keys.Queue.VariantBase): the names keys.Queue.Variant builds in Go, in
-- the queue's hash slot.
local function variant_keys(vbase, vm)
  local b = vbase .. string.sub(vm, 2)
  return { ready = b .. ':ready', delayed = b .. ':delayed' }
end

-- q.memo, when set (a call that places many runs), saves commands that
-- cannot change anything: memo.low[index][vm] is the lowest score this call
-- gave vm's entry in index (ckIndex or delayIndex), at or above its score
-- since (LT), so a later run of vm at or above it leaves the entry as it is
-- (the ZADD LT CH would answer 0); with memo.count the depth counts add up
-- in memo.r and memo.d for the caller to write once (place_flush), and
-- memo.sets.r and memo.sets.d list the ready and delayed sets the call
-- placed runs in, each once (memo.seen[set]: its runs; a bulk call gives
-- memo.args[set], the set's ZADD arguments, two a run, instead), and
-- memo.last.r and memo.last.d are the last of each, for place_flush to
-- widen.

-- Count a run placed in set in the depth field ('r' or 'd').
local function place_count(q, field, set)
  local memo = q.memo
  if memo and memo.count then
    memo[field] = memo[field] + 1
    memo.last[field] = set
    local c = memo.seen[set]
    if c then
      memo.seen[set] = c + 1
    else
      memo.seen[set] = 1
      local sets = memo.sets[field]
      sets[#sets + 1] = set
    end
  else
    place_widen(q, field, redis.call('HINCRBY', q.depth, field, '1'), 1, set)
  end
end

-- Whether vm's entry in index may move to score s (not when the memo knows
-- a score at or below s); notes s.
local function place_moves(q, index, vm, s)
  local memo = q.memo
  if not memo then return true end
  local low = memo.low[index]
  local was = low[vm]
  local x = s + 0
  if was and x >= was then return false end
  low[vm] = x
  return true
end

-- Whether delayed work due at `at` (k variants' delay-index entries, nil:
-- 1, just moved there; the master score did not move: the queue holds due
-- work, or delayed work due no later) is the queue's first delayed work
-- due after now, with no other due at or before at. A consumer that waits
-- beside due work that limits hold back looks early at the first such
-- time it read when it went to sleep (queueNext in runqueue/wake.go), so
-- it is told of an earlier one: without it, a free key's retry due in
-- 100 ms waited out the poll (Config.BlockPollInterval) beside a key at its
-- limit. Work due at the time of other delayed work is not told
-- (helper-193: runs of new keys all due at one time published at each
-- write). One ZCOUNT, in the calls that move an entry of the delay index
-- and not the master score, unless the call (q.memo.woke) already woke
-- consumers or tells none (q.nowake: repair).
local function place_soonest(q, at, now, k)
  local memo = q.memo
  if q.nowake or memo and memo.woke then return false end
  return redis.call('ZCOUNT', q.delay_index, string.format('(%d', now), at) <= (k or 1)
end

-- Put a queued run into its variant: ready (scored by ready score rs) when
-- available_at <= now, else delayed (scored by available_at). at and rs
-- are numbers or decimal strings. Maintains the depth counters, ckIndex /
-- delayIndex (LT keeps the head) and the master score, which can only move
-- when the index entry did (CH says so). hooks:ready_start(vm) runs when
-- the variant's ready head is new or earlier (the scheduler registers a
-- variant that has no tag).
-- Returns: whether the run is ready (its variant's head), the queue's
-- earliest work, or its first delayed work due after now (place_soonest):
-- a blocked consumer should look again.
local function place(q, v, hooks, id, vm, at, rs, now)
  local woke = false
  if at + 0 <= now then
    redis.call('ZADD', v.ready, rs, id)
    if place_moves(q, q.ck_index, vm, rs) and redis.call('ZADD', q.ck_index, 'LT', 'CH', rs, vm) == 1 then
      hooks:ready_start(vm)
      redis.call('ZADD', q.master, 'LT', rs, q.qm)
      woke = true
    end
    place_count(q, 'r', v.ready)
  else
    redis.call('ZADD', v.delayed, at, id)
    if place_moves(q, q.delay_index, vm, at) and redis.call('ZADD', q.delay_index, 'LT', 'CH', at, vm) == 1 then
      woke = redis.call('ZADD', q.master, 'LT', 'CH', at, q.qm) == 1 or place_soonest(q, at, now)
    end
    place_count(q, 'd', v.delayed)
  end
  if woke and q.memo then q.memo.woke = true end
  return woke
end

-- A memo for place (see there) of the queue q; count: add up the depth
-- counts.
local function place_memo(q, count)
  return { count = count, r = 0, d = 0, low = { [q.ck_index] = {}, [q.delay_index] = {} },
           sets = { r = {}, d = {} }, seen = {}, last = {} }
end

-- Write the depth counts a counting memo added up (and widen, see WIDE:
-- the sets place_widen picks of those the call placed runs in).
local function place_flush(q)
  local memo = q.memo
  if not (memo and memo.count) then return end
  if memo.r > 0 then
    place_widen(q, 'r', redis.call('HINCRBY', q.depth, 'r', num_arg(memo.r)), memo.r, memo)
  end
  if memo.d > 0 then
    place_widen(q, 'd', redis.call('HINCRBY', q.depth, 'd', num_arg(memo.d)), memo.d, memo)
  end
end

-- Point vm's entry in index (ckIndex or delayIndex) at the head score of
-- its set, or remove the entry when the set is empty. Returns false then.
local function index_head(set, index, vm)
  local head = redis.call('ZRANGE', set, '0', '0', 'WITHSCORES')
  if head[2] then
    redis.call('ZADD', index, head[2], vm)
    return true
  end
  redis.call('ZREM', index, vm)
  return false
end

-- Remove queued run id from its variant (ready or delayed) and fix the
-- indexes. hooks:ready_empty(vm) runs when the variant's last ready run
-- leaves. Returns false when the run was not queued.
local function unplace(q, v, hooks, id, vm)
  if redis.call('ZREM', v.ready, id) == 1 then
    depth_sub(q.depth, 'r', 1)
    if not index_head(v.ready, q.ck_index, vm) then hooks:ready_empty(vm) end
  elseif redis.call('ZREM', v.delayed, id) == 1 then
    depth_sub(q.depth, 'd', 1)
    index_head(v.delayed, q.delay_index, vm)
  else
    return false
  end
  master_refresh(q.ck_index, q.delay_index, q.master, q.qm)
  return true
end
-- In-flight runs. The queue's held HASH maps "<variant member>:<encoded
-- id>" to the delivery token of its holder (the queue's in-flight count is
-- its length); the queue's key-inflight HASH counts in-flight runs per
-- variant member (fields go at 0); the env's counter STRING counts them
-- across the env's queues; the shard's leases ZSET holds each run member
-- (run prefix .. field) with its lease deadline.
--
-- The wide marks (layout 5): Redis keeps a HASH of at most 512 fields
-- (hash-max-listpack-entries) whose values are all at most 64 bytes as a
-- listpack, which every lookup, insert and delete walks from its start; at
-- a few hundred runs in flight the held and key-inflight hashes cost a
-- dequeue and an ack more than the hash table would (callgrind on Redis
-- 7.0.15: a worker loop at 100 runs in flight over 100 keys spent about a
-- tenth of its instructions walking them). A dequeue that takes the
-- shard's token counter past a multiple of 64 while its env has 64 runs or
-- more in flight looks at the queue's held hash, and when it holds 64
-- fields or more gives it the field "~" with a value of more than 64 bytes
-- (and the key-inflight hash too, when it holds 64 or more), which turns it
-- into a hash table for the rest of its lifetime. No held field ("<variant
-- member>:<id>") and no variant member ("=" ...) is "~". The queue's
-- in-flight count is the held hash's length less its mark (held_count);
-- when the last run in flight leaves a marked held hash, both hashes go
-- (held_left), so an empty queue leaves no key behind.

-- Runs of the queue in flight: the held hash's fields but its mark.
local function held_count(held)
  local n = redis.call('HLEN', held)
  if n > 0 and redis.call('HEXISTS', held, '~') == 1 then n = n - 1 end
  return n
end

-- A dequeue that took the shard's token counter past a multiple of 64
-- (dq_finish tests it, for the wide sets too), with env_in runs of its env
-- in flight: mark the held hash (and kin) when due (see above). Looking
-- once per 64 tokens of the shard costs next to nothing.
local function held_widen(held, kin, env_in)
  if env_in < 64 or redis.call('HLEN', held) < 64 then return end
  redis.call('HSET', held, '~', 'runqueue: a value longer than 64 bytes keeps this hash a hash table, see lib/held.lua')
  if redis.call('HLEN', kin) >= 64 then redis.call('HSET', kin, '~', 'runqueue: a value longer than 64 bytes keeps this hash a hash table, see lib/held.lua') end
end

-- Runs left flight (their held fields are gone) and zeroed, the count of
-- some variant reached 0 (kin_release says): when a marked held hash holds
-- only its mark, both hashes go (every count of kin is 0 then: only its
-- mark, if any, is left). The last run of the queue to leave flight is the
-- last of its variant too, so a call in which no count reached 0 cannot
-- have emptied the queue and reads nothing. (An HLEN costs an ack less than
-- reading the mark with the holders: its value is long.)
local function held_left(held, kin, zeroed)
  if not zeroed then return end
  if redis.call('HLEN', held) == 1 and redis.call('HEXISTS', held, '~') == 1 then
    redis.call('DEL', held, kin)
  end
end

-- Check that run id of variant vm (held field vm:id, run member member)
-- is in flight under token (token "0": any holder whose lease has passed
-- now). Returns the holder's token, or nil and an error code: gone (no such
-- run at all: done already, or never queued), not_found (the run exists
-- under another key), not_in_flight, lease_lost, lease_active.
-- Why run id of variant vm is not held: gone, not_in_flight or not_found.
local function held_missing(runs, vm, id)
  local rec = redis.call('HGET', runs, id)
  if not rec then return 'gone' end
  if rec_parse(rec).vm == vm then return 'not_in_flight' end
  return 'not_found'
end

local function held_check(runs, held, leases, vm, id, member, token, now)
  local t = redis.call('HGET', held, vm .. ':' .. id)
  if not t then return nil, held_missing(runs, vm, id) end
  if token ~= '0' then
    if t ~= token then return nil, 'lease_lost' end
  else
    local deadline = num(redis.call('ZSCORE', leases, member))
    if deadline and deadline > now then return nil, 'lease_active' end
  end
  return t
end

-- Runs of the variants vms leave flight, per_vm[vm] of each (their held
-- fields and leases gone by the caller): the counts follow, in one read and
-- at most two writes. Returns whether the count of some variant reached 0.
local function kin_release(kin, vms, per_vm)
  if #vms == 1 then
    -- One variant: subtract (one command while runs are left in flight).
    if redis.call('HINCRBY', kin, vms[1], num_arg(-per_vm[vms[1]])) > 0 then return false end
    redis.call('HDEL', kin, vms[1])
    return true
  end
  local ns = redis.call('HMGET', kin, unpack(vms))
  local set, del = {}, {}
  for i, vm in ipairs(vms) do
    local left = (tonumber(ns[i]) or 0) - per_vm[vm]
    if left > 0 then
      set[#set + 1] = vm
      set[#set + 1] = num_arg(left)
    else
      del[#del + 1] = vm
    end
  end
  if #set > 0 then redis.call('HSET', kin, unpack(set)) end
  if #del > 0 then redis.call('HDEL', kin, unpack(del)) end
  return #del > 0
end

-- n runs of the env leave flight.
local function env_release(env_n, n)
  if redis.call('DECRBY', env_n, num_arg(n)) <= 0 then redis.call('DEL', env_n) end
end

local HELD_ERRORS = {
  gone = 'RQ_NOT_FOUND no such run',
  not_found = 'RQ_NOT_FOUND no such run',
  not_in_flight = 'RQ_NOT_IN_FLIGHT run is not in flight',
  lease_lost = 'RQ_LEASE_LOST lease is held by a later delivery',
  lease_active = 'RQ_LEASE_ACTIVE lease has not expired',
}

-- Ack n runs of one queue, given from args[first] on (variant member,
-- encoded id, delivery token: three values a run): each is removed
-- everywhere and its concurrency released. Returns one value per run: 1
-- acked, 0 gone already (an ack sent again after its first call went
-- through, or a run acked earlier in this call, under any key), or an
-- error code (not_found, not_in_flight, lease_lost). A run asked twice in
-- one call is acked by the entry with its holder's token, whichever comes
-- first (a stale delivery's ack and the holder's, sent together): each
-- entry answers what it would answer in a call of its own after the ones
-- before it.
local function held_ack(k, prefix, args, first, n, now, hooks)
  local out, fields, ids, members, per_vm, vms, gone = {}, {}, {}, {}, {}, {}, {}
  local asked = {}
  for i = 0, n - 1 do asked[i + 1] = args[first + 3 * i] .. ':' .. args[first + 1 + 3 * i] end
  local holders = redis.call('HMGET', k.held, unpack(asked))
  for i = 0, n - 1 do
    local vm, id, token = args[first + 3 * i], args[first + 1 + 3 * i], args[first + 2 + 3 * i]
    local member = prefix .. asked[i + 1]
    local err
    if gone[id] then
      -- Acked earlier in this call, under its one key (an id names one
      -- run of the queue): its record goes at the end of the call.
      err = 'gone'
    elseif not holders[i + 1] then
      err = held_missing(k.runs, vm, id)
    elseif holders[i + 1] ~= token then
      err = 'lease_lost'
    else
      gone[id] = true
    end
    if err == 'gone' then
      out[i + 1] = 0
    elseif err then
      out[i + 1] = err
    else
      out[i + 1] = 1
      fields[#fields + 1] = asked[i + 1]
      ids[#ids + 1] = id
      members[#members + 1] = member
      if not per_vm[vm] then
        per_vm[vm] = 0
        vms[#vms + 1] = vm
      end
      per_vm[vm] = per_vm[vm] + 1
    end
  end
  if #ids > 0 then
    redis.call('HDEL', k.held, unpack(fields))
    redis.call('HDEL', k.runs, unpack(ids))
    redis.call('ZREM', k.leases, unpack(members))
    held_left(k.held, k.kin, kin_release(k.kin, vms, per_vm))
    hooks:released(vms)
    env_release(k.env_n, #ids)
  end
  return out
end
-- The machinery both dequeue scripts share, as functions over one call's
-- state dq: binding its keys and arguments, the acks a call may carry (the
-- fused ack-and-dequeue), the capacity the env and queue limits leave,
-- promotion of due delayed runs, reading variants' heads, taking runs, and
-- moving the taken runs in flight (dq_finish).
--
-- KEYS and ARGV of a dequeue script (both flag states):
-- KEYS[1] -> queue ckIndex ZSET (variant member, score head ready score ms)
-- KEYS[2] -> queue delayIndex ZSET (variant member, score earliest available_at ms)
-- KEYS[3] -> queue depth HASH (r, d)
-- KEYS[4] -> shard master ZSET (queue member, score earliest work ms)
-- KEYS[5] -> shard leases ZSET (run member, score lease deadline ms)
-- KEYS[6] -> env in-flight counter STRING
-- KEYS[7] -> queue held HASH ("<variant member>:<encoded id>" -> delivery token)
-- KEYS[8] -> queue runs HASH (encoded id -> record)
-- KEYS[9] -> queue key-inflight HASH (variant member -> runs in flight)
-- KEYS[10] -> shard delivery token counter STRING
-- KEYS[11] -> shard ttl ZSET (run member, score expiry deadline ms)
-- ARGV[1] -> now (ms)
-- ARGV[2] -> maxCount (0..2000; 0: acks only)
-- ARGV[3] -> env concurrency limit, 0 for none
-- ARGV[4] -> queue concurrency limit (all keys), 0 for none
-- ARGV[5] -> per-key concurrency limit, 0 for none
-- ARGV[6] -> lease deadline (ms)
-- ARGV[7] -> queue member
-- ARGV[8] -> run member prefix (encoded env ":" encoded queue ":")
-- ARGV[9] -> priority step (ms)
-- ARGV[10] -> scan: age-order entries read, due delayed variants promoted
-- ARGV[11] -> promote limit: runs promoted per variant per call
-- ARGV[12] -> variant key base (keys.Queue.VariantBase)
-- ARGV[13] -> a, the number of runs to ack first (at most 1000)
-- ARGV[14+3i..16+3i] -> ack i: variant member, encoded id, delivery token
--
-- Variant keys are derived from the variant member (lib/place's
-- variant_keys), in the queue's hash slot.
-- (now_arg is now as the client sent it, for commands: a Lua number
-- argument costs Redis a %.17g format, some 2,700 instructions on Redis
-- 7.0, and a constant one is written as a string for the same reason.)
local function dq_open(keys, args)
  -- Effects replication, before the first write, for the TIME dq_finish
  -- reads (the token counter's floor): Redis 6.2 run with
  -- lua-replicate-commands no refuses every write after TIME, which would
  -- leave a call's served runs out of their ready sets but never in flight.
  -- Redis 7 always replicates effects and keeps the call as a no-op.
  if redis.replicate_commands then redis.replicate_commands() end
  local acks = args[13] + 0
  local dq = {
    ck_index = keys[1], delay_index = keys[2], depth = keys[3], master = keys[4], leases = keys[5],
    env_n = keys[6], held = keys[7], runs = keys[8], kin = keys[9], tokens = keys[10], ttl = keys[11],
    now = args[1] + 0, now_arg = args[1], max_count = args[2] + 0, env_limit = args[3] + 0,
    queue_limit = args[4] + 0, key_limit = args[5] + 0, lease_deadline = args[6],
    qm = args[7], run_prefix = args[8], priority_step = args[9] + 0, scan = args[10] + 0,
    promote_limit = args[11] + 0, vbase = args[12], acks = acks, own_args = 13 + 3 * acks,
    vars = {},     -- variant member -> { ready, delayed keys; head cache; counts }
    touched = {},  -- variant members in first-serve order
    served = {},   -- ids served, in serve order
    served_vm = {}, -- their variant members
    swept = {},    -- places in served of the runs swept at their head (dq_take)
    nswept = 0,    -- how many (they do not count for cap)
    sweep_room = 0, -- runs it may sweep: DQ_TTL_LOOK when the shard has one due (dq_due)
    dirty = false, -- promotion wrote something
    -- (set later; named here so that the table is made at its full size
    -- once, not grown past 32 fields by a rehash)
    cap = 0, delay_head = nil, ck_head = nil,
  }
  return dq
end

-- The acks the call carries, before anything else: their slots count for
-- this call's capacity.
local function dq_ack(dq, hooks)
  if dq.acks == 0 then return {} end
  return held_ack({ runs = dq.runs, held = dq.held, kin = dq.kin, env_n = dq.env_n, leases = dq.leases },
    dq.run_prefix, ARGV, 14, dq.acks, dq.now, hooks)
end

-- What the env and queue limits leave of maxCount.
local function dq_capacity(dq)
  local cap = dq.max_count
  if cap > 0 and dq.env_limit > 0 then
    cap = math.min(cap, dq.env_limit - (tonumber(redis.call('GET', dq.env_n)) or 0))
  end
  if cap > 0 and dq.queue_limit > 0 then cap = math.min(cap, dq.queue_limit - held_count(dq.held)) end
  dq.cap = cap
  return cap
end

-- How many runs past their TTL a call sweeps at most (vtime.TTLLook).
local DQ_TTL_LOOK = 100

-- Whether the call may sweep: one read of the shard's TTL set, for an
-- entry due by now (the common case: none, and no head is looked up).
local function dq_due(dq)
  if redis.call('ZRANGEBYSCORE', dq.ttl, '-inf', dq.now_arg, 'LIMIT', '0', '1')[1] then
    dq.sweep_room = DQ_TTL_LOOK
  end
end

local function dq_var(dq, vm)
  local c = dq.vars[vm]
  if c == nil then
    c = variant_keys(dq.vbase, vm)
    c.taken = 0
    dq.vars[vm] = c
  end
  return c
end

-- Move up to n due runs of variant vm from delayed to ready; returns how
-- many left the delayed set.
local function dq_promote_variant(dq, hooks, vm, n)
  local c = dq_var(dq, vm)
  local due = redis.call('ZRANGEBYSCORE', c.delayed, '-inf', dq.now_arg, 'LIMIT', '0', n)
  if #due > 0 then
    local recs = redis.call('HMGET', dq.runs, unpack(due))
    local zargs, min_rs = {}, nil
    for i, id in ipairs(due) do
      -- (a run without its record, evicted under Config.AllowEviction, is
      -- dropped: it leaves the delayed set and is not made ready)
      if recs[i] then
        local r = rec_parse(recs[i])
        -- (a record that does not parse, a hand edit or a writer's bug,
        -- is made ready now: the call that serves it dead-letters it, see
        -- killCorrupt, where every promotion that reached it failed; so is
        -- one whose at gopher-lua, miniredis's Lua, cannot read as a number)
        local at = r.pr and tonumber(r.at)
        local rs = at and at - r.pr * dq.priority_step or dq.now
        if min_rs == nil or rs < min_rs then min_rs = rs end
        zargs[#zargs + 1] = rs
        zargs[#zargs + 1] = id
      end
    end
    -- (the removal first: on a Redis at maxmemory a script is refused
    -- only at its first write that may add memory, and a promotion moves
    -- runs, it does not add them; a dequeue refused for its promotion
    -- would serve nothing, and a full Redis frees memory only by serving)
    redis.call('ZREM', c.delayed, unpack(due))
    if #zargs > 0 then redis.call('ZADD', c.ready, unpack(zargs)) end
    redis.call('HINCRBY', dq.depth, 'd', -#due)
    if #zargs > 0 then
      local ready_n = redis.call('HINCRBY', dq.depth, 'r', #zargs / 2)
      if redis.call('ZADD', dq.ck_index, 'LT', 'CH', min_rs, vm) == 1 then hooks:ready_start(vm) end
      place_widen(dq, 'r', ready_n, #zargs / 2, c.ready)
    end
    dq.dirty = true
  end
  index_head(c.delayed, dq.delay_index, vm)
  return #due
end

-- Runs of vm in flight before this call.
local function dq_inflight(dq, vm)
  local c = dq_var(dq, vm)
  if c.inflight_n == nil then c.inflight_n = tonumber(redis.call('HGET', dq.kin, vm)) or 0 end
  return c.inflight_n
end

-- True when vm's own limit blocks another serve.
local function dq_at_limit(dq, vm)
  if dq.key_limit <= 0 then return false end
  local c = dq_var(dq, vm)
  return dq_inflight(dq, vm) + c.taken - (c.swept or 0) >= dq.key_limit
end

-- dq_promote's second and third passes of a flag-off call
-- (vtime.spreadLeft) over the due variants at the positions filled
-- (those that filled their first share; then again over those not held,
-- with what the held took), plan holding what each took: each takes up to
-- the same share of left, ceil(left / #filled), within the promote limit;
-- those that filled that take what is still left, in order.
local function dq_spread(dq, hooks, due, plan, filled, left)
  if left <= 0 or not filled[1] then return end
  local limit = dq.promote_limit
  local share = math.ceil(left / #filled)
  local again = {}
  for _, i in ipairs(filled) do
    local want = math.min(share, limit - plan[i])
    if want > 0 then
      local got = dq_promote_variant(dq, hooks, due[i], want)
      if got == want then again[#again + 1] = i end
      plan[i] = plan[i] + got
      left = left - got
    end
  end
  for _, i in ipairs(again) do
    if left <= 0 then break end
    local more = math.min(limit - plan[i], left)
    if more > 0 then
      local got = dq_promote_variant(dq, hooks, due[i], more)
      plan[i] = plan[i] + got
      left = left - got
    end
  end
end

-- dq_promote's later passes of a flag-on call (vtime.fillByWeight): total
-- goes to the due variants at the positions among by weighted
-- water-filling, ws their milli-weights. Each can take cap = min(promote
-- limit - plan, its due runs left) more (one ZCOUNT of its due runs the
-- first time it is needed, kept in rest); in increasing order of cap /
-- weight, one whose cap is within its part of what is still to give, cap
-- <= total x weight / the weights' sum over those not yet given, takes
-- its cap, and the others take ceil(total x weight / sum) of what is left
-- then (within their cap). Then each is promoted once, in the order the
-- call reached them: what a variant cannot take goes to the others by
-- weight, none by its place.
local function dq_fill(dq, hooks, due, plan, among, total, ws, rest)
  local limit = dq.promote_limit
  local cand, cap = {}, {}
  for _, i in ipairs(among) do
    local c = limit - plan[i]
    if c > 0 then
      if rest[i] == nil then
        rest[i] = redis.call('ZCOUNT', dq_var(dq, due[i]).delayed, '-inf', dq.now_arg)
      end
      c = math.min(c, rest[i])
    end
    if c > 0 then
      cand[#cand + 1] = i
      cap[i] = c
    end
  end
  table.sort(cand, function(a, b)
    local x, y = cap[a] * ws[b], cap[b] * ws[a]
    if x ~= y then return x < y end
    return a < b
  end)
  local sum = 0
  for _, i in ipairs(cand) do sum = sum + ws[i] end
  local give, k = {}, 1
  while cand[k] and cap[cand[k]] * sum <= total * ws[cand[k]] do
    local i = cand[k]
    give[i] = cap[i]
    total = total - cap[i]
    sum = sum - ws[i]
    k = k + 1
  end
  for j = k, #cand do
    local i = cand[j]
    give[i] = math.ceil(total * ws[i] / sum)
  end
  for _, i in ipairs(among) do
    local g = give[i]
    if g and g > 0 then
      local got = dq_promote_variant(dq, hooks, due[i], g)
      plan[i] = plan[i] + got
      rest[i] = rest[i] - got
    end
  end
end

-- Promote the due delayed runs of the first scan due variants, as many of
-- each as the plan gives (vtime.PromotePlan flag off,
-- vtime.PromotePlanWeighted flag on): the call's budget, max(promote
-- limit, maxCount). First every variant takes up to its share, fixed when
-- the call starts: flag off the same, min(limit, ceil(budget /
-- variants)); flag on by weight, min(limit, ceil(budget x weight / the
-- variants' sum)). Then what they left goes to those that filled their
-- share: flag off by dq_spread (the same share again, then what is still
-- left in order), flag on by dq_fill (weighted water-filling). Then the
-- variants at their key limit (held: the call cannot serve them) keep what
-- they took, and the others take as much again, spread or filled as before
-- over those not held that filled their first share, so that the budget
-- goes whole to the variants the call can serve. So one call promotes
-- fewer than 2 x (budget + scan) runs however many are due, and a share
-- one variant left unused goes to others (flag off, what the second pass
-- leaves by a variant's place in the delay index: due time, then
-- member). A look at delayIndex's head comes first: when nothing is due
-- (the common case) it is all the call reads of delayed runs, and
-- dq_finish reuses it. pick, when given (the flag-on dequeue), chooses the
-- variants when more than scan are due: it gets the first scan + 1 and
-- returns those to promote. weigh, when given (the flag-on dequeue), gets
-- the variants to promote and returns their milli-weights.
local function dq_promote(dq, hooks, pick, weigh)
  local head = redis.call('ZRANGE', dq.delay_index, '0', '0', 'WITHSCORES')
  if not head[2] then
    dq.delay_head = false
    return
  end
  if num(head[2]) > dq.now then
    dq.delay_head = num(head[2])
    return
  end
  local n = dq.scan
  if pick then n = n + 1 end
  local due = redis.call('ZRANGEBYSCORE', dq.delay_index, '-inf', dq.now_arg, 'LIMIT', '0', n)
  if #due > dq.scan then due = pick(due) end
  local limit = dq.promote_limit
  local left = math.max(limit, dq.max_count)
  local share = math.min(limit, math.ceil(left / #due))
  local ws, sum = weigh and weigh(due), 0
  if ws then
    for i = 1, #ws do sum = sum + ws[i] end
  end
  local budget = left
  local filled, plan = {}, {}
  for i, vm in ipairs(due) do
    if ws then share = math.min(limit, math.ceil(budget * ws[i] / sum)) end
    local got = dq_promote_variant(dq, hooks, vm, share)
    if got == share then filled[#filled + 1] = i end
    plan[i] = got
    left = left - got
  end
  local spread, rest = ws and dq_fill or dq_spread, {}
  if left > 0 and filled[1] then spread(dq, hooks, due, plan, filled, left, ws, rest) end
  if dq.key_limit <= 0 then return end
  local more, free = 0, {}
  for _, i in ipairs(filled) do
    if not dq_at_limit(dq, due[i]) then free[#free + 1] = i end
  end
  for i, vm in ipairs(due) do
    if dq_at_limit(dq, vm) then more = more + plan[i] end
  end
  if more > 0 and free[1] then spread(dq, hooks, due, plan, free, more, ws, rest) end
end

-- Head of variant vm's ready ZSET as seen by this call (after the runs it
-- took), walked in memory: the first read takes up to 8 entries, each
-- further read doubles what is held, never past cap + 1 + sweep_room in
-- all (one more than the call can take and sweep, so running out of a
-- short read means the variant is empty).
-- Returns the head's ready score and id, or nil.
local function dq_head(dq, vm)
  local c = dq_var(dq, vm)
  local most = dq.cap + 1 + dq.sweep_room
  if c.list == nil then
    local want = math.min(most, 2)
    c.list = redis.call('ZRANGE', c.ready, '0', num_arg(want - 1), 'WITHSCORES')
    c.complete = #c.list < 2 * want
  end
  local p = 2 * c.taken + 1
  if c.list[p] == nil and not c.complete then
    local have = #c.list / 2
    local want = math.min(have, most - have)
    if want > 0 then
      local more = redis.call('ZRANGE', c.ready, num_arg(have), num_arg(have + want - 1), 'WITHSCORES')
      for _, x in ipairs(more) do c.list[#c.list + 1] = x end
      c.complete = #more < 2 * want
    end
  end
  if c.list[p] == nil then return nil end
  return num(c.list[p + 1]), c.list[p]
end

-- True when the head of vm (dq_head found one) has passed its TTL (its
-- TTL entry, due by now) and the call swept fewer than DQ_TTL_LOOK (vtime's
-- sweepHead): the call sweeps it (dq_take with swept). Each such run is
-- swept where the call meets it, as the TTL sweep would delete it: no
-- serve, not counted for the call's capacity or its key's limit.
local function dq_head_due(dq, vm)
  if dq.nswept >= dq.sweep_room then return false end
  local c = dq_var(dq, vm)
  local at = redis.call('ZSCORE', dq.ttl, dq.run_prefix .. vm .. ':' .. c.list[2 * c.taken + 1])
  return at and num(at) <= dq.now or false
end

-- Serve the head of vm (dq_head found one), or, swept, sweep it (it
-- counts neither for cap nor for vm's limit; dq_finish deletes it);
-- returns the next head's ready score, or nil when vm has no ready run
-- left.
local function dq_take(dq, vm, swept)
  local c = dq_var(dq, vm)
  local p = 2 * c.taken + 1
  local id = c.list[p]
  if c.taken == 0 then dq.touched[#dq.touched + 1] = vm end
  c.taken = c.taken + 1
  local k = #dq.served + 1
  dq.served[k], dq.served_vm[k] = id, vm
  if swept then
    c.swept = (c.swept or 0) + 1
    dq.swept[k] = c.list[p + 1] -- its ready score (see dq_finish's back)
    dq.nswept = dq.nswept + 1
  end
  return (dq_head(dq, vm))
end

-- Persist the serves chosen in memory: take the runs out of their ready
-- sets, move them in flight with a lease and a delivery token (unique in
-- the shard for ever: a counter), fix the indexes, the counts and the
-- master score. Records are returned as stored, unparsed (Go reads them);
-- a served run with a TTL leaves the TTL set (its record keeps the
-- deadline until the next rewrite clears it: see lib/record). A run taken
-- whose TTL passed (never delivered, its deadline at or before the call's
-- time) is expired instead, as the TTL sweep would have (vtime's
-- expireTaken): its record and TTL entry go, it takes no slot, lease or
-- token, and, unless the call swept it (dq_take), its variant is in
-- dq.expired_vms (the flag-on dequeue frees its slot for the scheduler as
-- an ack does).
-- Returns a flat array: acks' results count, the acks' results, then for
-- each run taken, in the order taken: encoded id, variant member, record,
-- delivery token; for one expired: encoded id, variant member, false, 0,
-- or -1 for one swept.
local function dq_finish(dq, acked)
  local out = { #acked }
  for _, a in ipairs(acked) do out[#out + 1] = a end
  if #dq.served == 0 then
    if dq.dirty then master_refresh(dq.ck_index, dq.delay_index, dq.master, dq.qm, dq.delay_head, dq.ck_head) end
    return out
  end
  local ids, vms = dq.served, dq.served_vm
  local recs = redis.call('HMGET', dq.runs, unpack(ids))
  -- skip: the places in dq.served of the runs taken whose TTL passed. The
  -- record decides: a run swept for a TTL entry its record does not have
  -- (a hand edit) goes back to its ready set at its score, neither
  -- delivered nor expired (back: its place -> its record's deadline, or
  -- false), and its entry is mended.
  local skip, back = nil, nil
  for i = 1, #ids do
    local rec = recs[i]
    local ttl = false -- the record's deadline (of the variant taken), if any
    if rec and rec_has_ttl(rec) then
      local r = rec_parse(rec)
      if r.ttl and r.vm == vms[i] then ttl = r.ttl end
    end
    if ttl and ttl + 0 <= dq.now then
      skip = skip or {}
      skip[i] = true
    elseif dq.swept[i] then
      back = back or {}
      back[i] = ttl
    end
  end
  if skip or back then
    -- The live runs in lists of their own; the expired ones counted per
    -- variant (c.expired).
    local lids, lvms, lrecs, gids, gmembers = {}, {}, {}, {}, {}
    skip = skip or {}
    dq.expired_vms = {}
    for i = 1, #ids do
      local vm = vms[i]
      if back and back[i] ~= nil then
        local c = dq.vars[vm]
        c.back = c.back or {}
        c.back[#c.back + 1] = dq.swept[i]
        c.back[#c.back + 1] = ids[i]
        local member = dq.run_prefix .. vm .. ':' .. ids[i]
        if back[i] then
          redis.call('ZADD', dq.ttl, back[i], member)
        else
          redis.call('ZREM', dq.ttl, member)
        end
      elseif skip[i] then
        local c = dq.vars[vm]
        if not dq.swept[i] and not c.released then
          c.released = true
          dq.expired_vms[#dq.expired_vms + 1] = vm
        end
        c.expired = (c.expired or 0) + 1
        gids[#gids + 1] = ids[i]
        gmembers[#gmembers + 1] = dq.run_prefix .. vm .. ':' .. ids[i]
      else
        local k = #lids + 1
        lids[k], lvms[k], lrecs[k] = ids[i], vm, recs[i]
      end
    end
    if not dq.expired_vms[1] then dq.expired_vms = nil end -- (all swept)
    if gids[1] then
      redis.call('HDEL', dq.runs, unpack(gids))
      redis.call('ZREM', dq.ttl, unpack(gmembers))
    end
    ids, vms, recs = lids, lvms, lrecs
  end
  -- The in-flight counts of the touched variants not read yet, in one read;
  -- a call that touched one variant whose count it has not read adds to it
  -- instead (one command, not a read and a write).
  local unread = {}
  for _, vm in ipairs(dq.touched) do
    if dq.vars[vm].inflight_n == nil then unread[#unread + 1] = vm end
  end
  local added = #dq.touched == 1 and #unread == 1
  if not added and #unread > 0 then
    local ns = redis.call('HMGET', dq.kin, unpack(unread))
    for i, vm in ipairs(unread) do dq.vars[vm].inflight_n = tonumber(ns[i]) or 0 end
  end
  -- dq_head read past the last run taken (or found the set ended), so the
  -- new head of each touched variant is known without reading it again.
  local heads, emptied, counts = {}, {}, {}
  local nback = 0
  for _, vm in ipairs(dq.touched) do
    local c = dq.vars[vm]
    redis.call('ZREMRANGEBYRANK', c.ready, '0', num_arg(c.taken - 1))
    local p = 2 * c.taken + 1
    local head = c.list[p] and c.list[p + 1]
    c.idle = c.expired or 0 -- runs taken that are not in flight
    if c.back then
      redis.call('ZADD', c.ready, unpack(c.back))
      for j = 1, #c.back, 2 do
        if not head or num(c.back[j]) < num(head) then head = c.back[j] end
      end
      c.idle = c.idle + #c.back / 2
      nback = nback + #c.back / 2
    end
    if head then
      heads[#heads + 1] = head
      heads[#heads + 1] = vm
    else
      emptied[#emptied + 1] = vm
    end
    -- (a variant whose runs taken all expired keeps its count as it is)
    if not added and c.taken > c.idle then
      counts[#counts + 1] = vm
      counts[#counts + 1] = num_arg(dq_inflight(dq, vm) + c.taken - c.idle)
    end
  end
  for i = 1, #heads, 1000 do
    redis.call('ZADD', dq.ck_index, unpack(heads, i, math.min(i + 999, #heads)))
  end
  for i = 1, #emptied, 1000 do
    redis.call('ZREM', dq.ck_index, unpack(emptied, i, math.min(i + 999, #emptied)))
  end
  -- (the counts after the removals: on a Redis at maxmemory a script is
  -- refused only at its first write that may add memory, and a serve's
  -- first write removes runs from their ready sets, so a full Redis still
  -- hands out runs, whose acks free memory)
  if added then
    local c = dq.vars[unread[1]]
    if c.taken > c.idle then
      redis.call('HINCRBY', dq.kin, unread[1], num_arg(c.taken - c.idle))
    end
  elseif #counts > 0 then
    redis.call('HSET', dq.kin, unpack(counts))
  end
  depth_sub(dq.depth, 'r', #dq.served - nback)

  local n = #ids
  if n == 0 then
    local o = #out
    for i, id in ipairs(dq.served) do
      if not (back and back[i] ~= nil) then
        out[o + 1], out[o + 2], out[o + 3], out[o + 4] = id, dq.served_vm[i], false, dq.swept[i] and -1 or 0
        o = o + 4
      end
    end
    master_refresh(dq.ck_index, dq.delay_index, dq.master, dq.qm, dq.delay_head, dq.ck_head)
    return out
  end
  local token0 = redis.call('INCRBY', dq.tokens, num_arg(n)) - n
  -- The counter never runs behind the clock: a call that finds it below
  -- the time in microseconds (below 2^52 until the year 2112), rounded
  -- down to a multiple of 10,240, moves it there. The time is the later of
  -- the call's (the caller's clock, as it sent the call) and the server's
  -- (TIME): a call that go-redis sent again after the master it first went
  -- to died, to the replica that took over, carries its caller's time from
  -- before the failover, and would deal again the tokens the dead master
  -- dealt after it. A new counter (a new shard, or its key lost with the
  -- data: a restart without persistence) and one behind (a failover to a
  -- replica that had not received the last deliveries) so start above
  -- every token dealt before, at an earlier time, so that a holder of a
  -- delivery from before the loss cannot act on one made after it. While
  -- the shard deals fewer than about 10,176 tokens per 10.24 ms (10,240
  -- less the place kept below), that is one SET per 10.24 ms at most. The
  -- floor is a multiple of 64, as 0 is, and a move keeps the counter's
  -- place among the multiples of 64: the wide checks below fall once per
  -- 64 deliveries however often the counter moves (the cost stays the same
  -- from one counter to the next, and under a clock that runs fast against
  -- the work, as the server's does under a profiler).
  local time = redis.call('TIME')
  local floor = math.min(math.max(dq.now * 1000, time[1] * 1000000 + time[2]), 4503599627370496)
  floor = floor - floor % 10240
  if token0 < floor then
    token0 = floor + token0 % 64
    redis.call('SET', dq.tokens, num_arg(token0 + n))
  end
  local env_in = redis.call('INCRBY', dq.env_n, num_arg(n))
  local fields, leases = {}, {}
  for i, id in ipairs(ids) do
    local vm = vms[i]
    fields[2 * i - 1] = vm .. ':' .. id
    fields[2 * i] = num_arg(token0 + i)
    leases[2 * i - 1] = dq.lease_deadline
    leases[2 * i] = dq.run_prefix .. vm .. ':' .. id
  end
  redis.call('HSET', dq.held, unpack(fields))
  redis.call('ZADD', dq.leases, unpack(leases))
  -- Once per 64 tokens of the shard (past a multiple of 64): the wide
  -- marks of the in-flight hashes (lib/held) and the wide sets (lib/place).
  if n >= 64 or (token0 + n) % 64 < n then
    held_widen(dq.held, dq.kin, env_in)
    widen({ dq.ck_index, dq.leases }, dq.runs)
  end
  -- The runs in the order taken, the expired ones in their places.
  local expiring = {}
  local o, j = #out, 0
  for i, id in ipairs(dq.served) do
    if back and back[i] ~= nil then
      o = o - 4 -- (back in its ready set: not in the reply)
    elseif skip and skip[i] then
      out[o + 1], out[o + 2], out[o + 3], out[o + 4] = id, dq.served_vm[i], false, dq.swept[i] and -1 or 0
    else
      j = j + 1
      out[o + 1], out[o + 2], out[o + 3], out[o + 4] = id, vms[j], recs[j], token0 + j
      -- (no record: the runs hash was evicted, Config.AllowEviction; the
      -- run goes out without one and the client acks it at once)
      if recs[j] and rec_has_ttl(recs[j]) then expiring[#expiring + 1] = leases[2 * j] end
    end
    o = o + 4
  end
  if #expiring > 0 then redis.call('ZREM', dq.ttl, unpack(expiring)) end
  master_refresh(dq.ck_index, dq.delay_index, dq.master, dq.qm, dq.delay_head, dq.ck_head)
  return out
end
-- A span: a sorted list kept as s.list[s.head..s.tail], for the windows
-- both dequeues keep of the variants they read. A serve takes an entry
-- near the front and puts it back further on: dropping the front by
-- moving head on, and inserting by shifting the shorter side, costs a few
-- moves where table.remove and table.insert shift every later entry
-- through Lua's C API (some 100 instructions each).

-- Insert e at position lo (head <= lo <= tail + 1): the entries before lo
-- move one place back when the head has room and they are fewer, else
-- those from lo one place on.
local function span_insert(s, lo, e)
  local list = s.list
  if s.head > 1 and lo - s.head < s.tail + 1 - lo then
    for j = s.head, lo - 1 do list[j - 1] = list[j] end
    s.head = s.head - 1
    list[lo - 1] = e
  else
    for j = s.tail, lo, -1 do list[j + 1] = list[j] end
    s.tail = s.tail + 1
    list[lo] = e
  end
end

-- Insert e at its rank in the sorted span: before the first entry it sorts
-- before by less (a binary search: a call of n serves over n entries costs
-- n log n comparisons, not n^2). A served entry most often sorts last, so
-- the last entry is compared first.
local function span_place(s, e, less)
  local list = s.list
  local lo, hi = s.head, s.tail + 1
  if lo < hi and not less(e, list[hi - 1]) then lo = hi end
  while lo < hi do
    local mid = lo + hi
    mid = (mid - mid % 2) / 2 -- (floor without a call)
    if less(e, list[mid]) then hi = mid else lo = mid + 1 end
  end
  span_insert(s, lo, e)
end

-- Remove the entry at position i (head <= i <= tail) and return it: the
-- entries before it move one place on (none when i is the head).
local function span_remove(s, i)
  local list = s.list
  local e = list[i]
  for j = i, s.head + 1, -1 do list[j] = list[j - 1] end
  list[s.head] = nil
  s.head = s.head + 1
  return e
end
-- The queues waiting for a slot of their env (layout 8; flag-on dequeues
-- with an env limit only; the line's reads and wake-ups are lib/envline).
-- An env's limit is shared by its queues, and a dequeue serves one queue:
-- without this, a consumer that acks and takes in one call takes back
-- every slot its acks free, and another queue of the env at its limit
-- waits until that queue's backlog drains.
--
-- The line: a ZSET of the waiting queues (member: the queue's member,
-- score: its place) and a HASH beside it (the queue's member -> "till:
-- limit", the time its mark lives until, in ms of Redis's own clock, TIME:
-- the callers' clocks may disagree, and the env limit of the call that
-- last wrote it; "#" -> the last place given; a queue member always holds
-- a ':').
-- A dequeue whose call the env's limit held to less than it could take
-- otherwise (the queue's limit and maxCount), and that leaves ready or due
-- runs behind, marks its queue: the place is kept while the queue waits
-- without being served, and a new one (the back of the line) is taken when
-- it was served or had none. A dequeue that the env does not hold so, or
-- that leaves nothing ready, drops its mark (and the keys with the last
-- one). A mark past its until is dead (its consumer gone or gone quiet)
-- and dropped by the call that meets it; a waiter renews it at each held
-- call (until: TIME + the caller's mark life). The keys expire with the
-- longest-lived mark.
--
-- Every dequeue of the env's queues leaves a free slot to each live mark
-- of another queue ahead of its own in the line (to every one when it has
-- none) and publishes a wake-up to them, and takes at most what the
-- lowest limit among them leaves (a mark is left a slot only when its own
-- limit leaves it one: lib/envline's ew_live); a call that used fewer of the
-- slots left to it wakes as many queues behind it (a waiting queue whose
-- ready runs cannot be served, all of their keys at their limit, passes
-- its turn on). At most EW_WAKE_MAX wake-ups a call. A call reads the line
-- only while the env has free slots, and then at most as many marks ahead
-- of it as there are free slots (and the dead ones it drops on the way).
-- A flag-on ack or requeue (a plain Ack, AckMany, Nack, a lease recovery)
-- that frees slots of the env wakes the live marks they go to, in line
-- order (lib/hooks_vtime); before, such a slot waited for the next dequeue
-- of the env or the waiting queue's poll.
--
-- A mark with at most grace (ms) of its life left is leaving: no slot is
-- left to it (the calls pass over it to the marks behind), but it keeps its
-- place until it lapses, and a call of its own queue renews it there (to
-- the longer of its life and the caller's: consumers of one queue may poll
-- at different intervals). A consumer that stops or cannot take runs now
-- (a Worker's graceful Shutdown, a Worker whose handlers are all busy
-- with other queues' runs, a DequeueWait that returns empty) sends a call of
-- maxCount 0 with a negative life (ew_leave): its queue's mark is cut to
-- grace, leaving at once, the env's free slots go to the marks behind it,
-- and the queue's other consumers are woken, so that one still waiting
-- renews the mark in its place; with none left the mark lapses after grace.
-- Before, every free slot of the env was left to the stopped consumer's
-- mark for the rest of its life (two of its poll intervals and a second).
-- A Worker or DequeueWait that waits renews its mark at least once a poll,
-- so its mark has more than grace left while it waits; a consumer that
-- calls less often (a plain Dequeue loop slower than its poll interval, a
-- Worker whose handlers are all busy or that backs off after failures) may
-- find its mark passed over in its last half second. The stopping
-- consumer's own acks (ack-only calls, maxCount 0) pass over its leaving
-- mark too, and wake the marks behind it for the slots they free.
--
-- The marks are best effort: their writes go by pcall, so that on a Redis
-- at maxmemory (where a script run by EVALSHA is refused at its first write
-- that may add memory) a held dequeue still returns, serving nothing, as it
-- did before the line.


-- A consumer leaving (a negative life): its queue's mark, if any, lives at
-- most grace more (leaving), and a wake-up goes to the queue's other
-- consumers. It says whether the queue had a mark.
local function ew_leave(ew)
  local qm = ew.dq.qm
  local till, lim = ew_mark(redis.call('HGET', ew.lives, qm))
  if not till then return false end
  local cut = ew_time(ew) + ew.grace
  if till > cut then ew_write('HSET', ew.lives, qm, string.format('%d:%d', cut, lim)) end
  redis.call('PUBLISH', ew.wake, qm)
  return true
end

-- After dq_capacity: dq.cap less the env's free slots left to the queues
-- that wait ahead. An ack-only call (maxCount 0) wakes them and changes
-- no mark; one with a negative life (maxCount 0) leaves first (ew_leave):
-- when its queue had a mark, or the call carries acks (their slots are
-- left to the line), it goes on as an ack-only call whose own mark is
-- leaving, and wakes the marks the env's free slots now go to.
local function ew_capacity(ew)
  local dq = ew.dq
  if ew.life < 0 and not ew_leave(ew) and dq.acks == 0 then return end
  if redis.call('ZCARD', ew.line) == 0 then
    -- No queue waits: nothing to leave or wake, no mark to keep. Whether
    -- the env held the call is read after the serves, and only when the
    -- call used all its room (ew_settle).
    ew.lazy, ew.top = true, 0
    return
  end
  ew.count = ew_count(dq)
  local free = dq.env_limit - ew.count
  local turn = redis.call('ZSCORE', ew.line, dq.qm)
  if turn then
    -- (a mark not written "till:limit", a hand edit, is dead: nil)
    local v = redis.call('HMGET', ew.lives, dq.qm, '^')
    local till = ew_mark(v[1])
    ew.top = tonumber(v[2]) or 0
    if till and till >= ew_time(ew) then ew.mine, ew.till = turn + 0, till else ew_drop(ew, { dq.qm }) end
    -- (an ack-only call of a queue whose mark is leaving, a stopped
    -- Worker's leave and acks: the slots go past its mark, so it wakes the
    -- marks behind it too: helper-206)
    if ew.mine and dq.max_count <= 0 and till - ew_time(ew) <= ew.grace then ew.mine = nil end
  end
  if free > 0 then
    local hi = '+inf'
    if ew.mine then hi = '(' .. ew.mine end
    ew.ahead, ew.lowest = ew_wake_live(ew, '-inf', hi, free, ew.count)
  elseif dq.acks > 0 then
    -- (the call's acks freed slots its own limit leaves it no use of: one
    -- mark whose limit does is woken, as a plain ack's hooks_finish does)
    ew_wake_one(ew, ew.count)
  end
  if dq.max_count <= 0 then return end
  -- (the marks ahead use their slots at counts up to ew.count + ahead,
  -- below each one's limit: the call's serves must leave them that)
  ew.room = math.min(dq.env_limit, ew.lowest) - ew.count - ew.ahead
  -- What the call could take but for the env: maxCount within the
  -- queue's limit.
  local other = dq.max_count
  if dq.queue_limit > 0 then other = math.min(other, dq.queue_limit - held_count(dq.held)) end
  ew.held = other > 0 and ew.room < other
  if ew.room < dq.cap then dq.cap = math.max(ew.room, 0) end
end

-- Whether the queue has work a later call could serve: a ready run, or a
-- delayed one now due (a held call returns before it promotes).
local function ew_work(dq)
  if redis.call('EXISTS', dq.ck_index) == 1 then return true end
  return redis.call('ZRANGEBYSCORE', dq.delay_index, '-inf', dq.now_arg, 'LIMIT', 0, 1)[1] ~= nil
end

-- After the serves (served: how many the call took): the call's mark, and
-- the wake-ups for the slots left to it that it did not use.
local function ew_settle(ew, served)
  local dq = ew.dq
  if dq.max_count <= 0 then return end
  if ew.lazy then
    -- (no marks were read: the call had the env's free slots, dq.cap, as
    -- its room; it was held by the env when it took them all, fewer than
    -- maxCount, and the env is full now while its queue is not)
    if served < dq.cap or served >= dq.max_count then return end
    if dq.env_limit - ew_count(dq) > 0 then return end
    if dq.queue_limit > 0 and dq.queue_limit - held_count(dq.held) <= 0 then return end
    ew.held, ew.room = true, served
  end
  local turn = nil
  if ew.held and served >= ew.room and ew_work(dq) then
    turn = ew.mine
    if turn == nil or served > 0 then turn = ew_write('HINCRBY', ew.lives, '#', 1) end
  end
  if turn then
    local till = ew_time(ew) + ew.life
    -- (a renewal in place keeps the longer life: consumers of one queue
    -- with different polls renew one mark, and one with a short poll must
    -- not cut the life of a waiter with a longer one, which would then
    -- lapse before that waiter's next call: helper-207)
    if turn == ew.mine and ew.till > till then till = ew.till end
    local mark = { 'HSET', ew.lives, dq.qm, string.format('%d:%d', till, dq.env_limit) }
    -- ("^": the highest limit of the line's marks)
    if dq.env_limit > ew_top(ew) then mark[5], mark[6] = '^', dq.env_limit end
    if ew_write(unpack(mark)) and ew_write('ZADD', ew.line, turn, dq.qm) then
      -- (the keys live as long as their longest-lived mark)
      for _, k in ipairs({ ew.line, ew.lives }) do
        if redis.call('PTTL', k) < ew.life then ew_write('PEXPIRE', k, ew.life) end
      end
    end
  elseif ew.mine ~= nil then
    ew_drop(ew, { dq.qm })
  end
  if ew.mine ~= nil then
    local n, count = ew.room - served, ew.count + ew.ahead + served
    -- (the call's own limit left it no more, or its place kept a slot for
    -- a limit it no longer has, while a mark behind may have a higher
    -- limit that leaves it one: one of them is woken, by their limits)
    if n <= 0 and math.min(ew_top(ew), ew.lowest) > count then n = 1 end
    if n > 0 then ew_wake_live(ew, '(' .. ew.mine, '+inf', n, count, ew.lowest) end
  end
end

local function script_enqueue_vtime(keys, args)
KEYS, ARGV = keys, args
-- enqueue: store runs of one base queue and queue each in its variant
-- (ready or delayed). Each run is all or nothing; a run whose id exists is
-- a no-op when its variant and payload are the same (an idempotent retry)
-- and a conflict otherwise.
--
-- KEYS[1] -> queue runs HASH (encoded id -> record, see lib/record)
-- KEYS[2] -> queue ckIndex ZSET (variant member, score head ready score ms)
-- KEYS[3] -> queue delayIndex ZSET (variant member, score earliest available_at ms)
-- KEYS[4] -> queue depth HASH (r: ready count, d: delayed count)
-- KEYS[5] -> shard master ZSET (queue member, score earliest work ms)
-- KEYS[6] -> shard ttl ZSET (run member, score expiry deadline ms)
-- ARGV[1] -> now (ms)
-- ARGV[2] -> variant key base (keys.Queue.VariantBase)
-- ARGV[3] -> queue member (for the master ZSET)
-- ARGV[4] -> wake channel ("" to not publish)
-- ARGV[5] -> maximum queued runs in the queue, 0 for no limit
-- ARGV[6] -> maximum queued runs in a variant, 0 for no limit
-- ARGV[7] -> run member prefix (encoded env ":" encoded queue ":")
-- ARGV[8] -> n, the number of runs (at most 1000)
-- ARGV[9+7i..15+7i] -> run i: encoded id, variant member, record, payload
--                      offset in the record, available_at (ms), ready score
--                      (ms), expiry deadline (ms, 0 for none)
-- Flag on: KEYS[7..9] and ARGV[9+7n..11+7n] follow, the scheduler's (see
-- lib/hooks_vtime).
-- Returns: one value per run: 1 queued, 0 already queued with the same
-- variant and payload (no-op), "conflict" (same id, other body),
-- "queue_full" or "key_full" (admission refused; nothing written).
local q = { runs = KEYS[1], ck_index = KEYS[2], delay_index = KEYS[3], depth = KEYS[4],
            master = KEYS[5], qm = ARGV[3] }
local ttl_set = KEYS[6]
local now = ARGV[1] + 0 -- (client-written integers: see num in lib/record)
local vbase, wake, prefix = ARGV[2], ARGV[4], ARGV[7]
local max_queue, max_key, n = ARGV[5] + 0, ARGV[6] + 0, ARGV[8] + 0
local OWN_KEYS, OWN_ARGS = 6, 8 + 7 * n
local hooks = hooks_open(KEYS, ARGV, OWN_KEYS, OWN_ARGS, now)

-- Whether a run of variant v may be queued now (admission control); nil
-- without a limit. (A script makes a closure of every function it defines
-- at every call, some 1,100 instructions each on Redis 7.0: the functions
-- only some calls need are made only for those.)
local admitted = nil
if max_queue > 0 or max_key > 0 then
  admitted = function(v)
    if max_queue > 0 then
      local d = redis.call('HMGET', q.depth, 'r', 'd')
      if (tonumber(d[1]) or 0) + (tonumber(d[2]) or 0) >= max_queue then return 'queue_full' end
    end
    if max_key > 0 and redis.call('ZCARD', v.ready) + redis.call('ZCARD', v.delayed) >= max_key then
      return 'key_full'
    end
    return nil
  end
end

-- The answer to run i (argument base b) when its id is stored already,
-- with record old: 0 when it is the same run (same variant and payload:
-- an idempotent retry), else 'conflict'.
local function stored_answer(old, b)
  local r = rec_parse(old)
  if r.vm == ARGV[b + 1] and string.sub(old, r.pos) == string.sub(ARGV[b + 2], tonumber(ARGV[b + 3])) then
    return 0
  end
  return 'conflict'
end

-- One run at a time (few runs, or admission limits that each run reads):
-- each run's commands in turn.
local function enqueue_each()
  local out, woke = {}, false
  -- Several runs: index entries that cannot move are not written again,
  -- and the depth counts are written once at the end, unless admission
  -- reads them.
  if n > 1 then q.memo = place_memo(q, max_queue == 0) end
  for i = 0, n - 1 do
    local b = 9 + 7 * i
    local id, vm, rec, at, rs, expires = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 4], ARGV[b + 5], ARGV[b + 6]
    local v = variant_keys(vbase, vm)
    if redis.call('HSETNX', q.runs, id, rec) == 0 then
      out[i + 1] = stored_answer(redis.call('HGET', q.runs, id), b)
    else
      local refused = admitted and admitted(v)
      if refused then
        redis.call('HDEL', q.runs, id)
        out[i + 1] = refused
      else
        if expires ~= '0' then redis.call('ZADD', ttl_set, expires, prefix .. vm .. ':' .. id) end
        if place(q, v, hooks, id, vm, at, rs, now) then woke = true end
        out[i + 1] = 1
      end
    end
  end
  place_flush(q)
  return out, woke
end

-- In bulk from BULK_AT runs (with no admission limit): below it a command
-- per run costs Redis less than sorting the runs into their sets (measured
-- on Redis 7.0 with every run of another key: the bulk path costs 10%
-- more at 10 runs, the same at 100, 20% less at 1,000; with runs of a few
-- keys it costs 5% to 40% less from 10 runs on).
local BULK_AT = 32
local out, woke
if n >= BULK_AT and max_queue == 0 and max_key == 0 then
  -- (made only for a call that writes in bulk: see admitted)
  -- Move the entries of index (ckIndex or delayIndex) as the new runs one
  -- at a time would: run k of variant vms[k] scores ss[k] (in run order),
  -- with place's memo (q.memo) sparing the ZADD LT CH an earlier run of the
  -- variant makes a no-op. Returns the variant of each move in order (a
  -- variant again when it moves again: the scheduler hears of each move, as
  -- run by run, since a hook may start its state again in between) and the
  -- lowest score moved to (as given), or nil when none moved.
  local function index_moves(index, vms, ss)
    local moves, head, head_s, head_n = {}, nil, nil, 0
    for k, vm in ipairs(vms) do
      if place_moves(q, index, vm, ss[k]) and redis.call('ZADD', index, 'LT', 'CH', ss[k], vm) == 1 then
        moves[#moves + 1] = vm
        local s = ss[k] + 0
        if head == nil or s < head then head, head_s, head_n = s, ss[k], 1 elseif s == head then head_n = head_n + 1 end
      end
    end
    if #moves == 0 then return nil end
    return moves, head_s, head_n
  end

  -- Many runs and no admission limit: each kind of write in one command
  -- (a read of the ids, the records, each variant's set, the indexes), with
  -- the outcome of the runs queued one at a time: the same data, the same
  -- answers, and the scheduler told of the same variants in the same order.
  local function enqueue_batch()
    local ids = {}
    for i = 0, n - 1 do ids[i + 1] = ARGV[9 + 7 * i] end
    local stored = redis.call('HMGET', q.runs, unpack(ids))
    local out, first = {}, {} -- first: id -> argument base of the run that queued it
    local recs, ttls, sets, vkeys = {}, {}, {}, {}
    local order = { r = {}, d = {} } -- the ready and the delayed sets, as first written
    local rvm, rss, dvm, dss = {}, {}, {}, {} -- new ready and delayed runs: variant, score
    for i = 0, n - 1 do
      local b = 9 + 7 * i
      local id = ids[i + 1]
      if stored[i + 1] then
        out[i + 1] = stored_answer(stored[i + 1], b)
      elseif first[id] then
        out[i + 1] = stored_answer(ARGV[first[id] + 2], b)
      else
        first[id] = b
        out[i + 1] = 1
        local vm, at, expires = ARGV[b + 1], ARGV[b + 4], ARGV[b + 6]
        recs[#recs + 1] = id
        recs[#recs + 1] = ARGV[b + 2]
        if expires ~= '0' then
          ttls[#ttls + 1] = expires
          ttls[#ttls + 1] = prefix .. vm .. ':' .. id
        end
        local v = vkeys[vm]
        if v == nil then
          v = variant_keys(vbase, vm)
          vkeys[vm] = v
        end
        local set, score, kind
        if at + 0 <= now then
          set, score, kind = v.ready, ARGV[b + 5], 'r'
          rvm[#rvm + 1], rss[#rss + 1] = vm, score
        else
          set, score, kind = v.delayed, at, 'd'
          dvm[#dvm + 1], dss[#dss + 1] = vm, score
        end
        local z = sets[set]
        if z == nil then
          sets[set] = { score, id }
          local o = order[kind]
          o[#o + 1] = set
        else
          z[#z + 1] = score
          z[#z + 1] = id
        end
      end
    end
    if #recs == 0 then return out, false end
    redis.call('HSET', q.runs, unpack(recs))
    if #ttls > 0 then redis.call('ZADD', ttl_set, unpack(ttls)) end
    for _, o in ipairs({ order.r, order.d }) do
      for _, set in ipairs(o) do redis.call('ZADD', set, unpack(sets[set])) end
    end
    -- A counting memo of what was placed, for place_flush: the counts, the
    -- sets of each kind in order, their ZADD arguments (two a run: see
    -- place_memo), the last run's sets.
    local memo = place_memo(q, true)
    memo.r, memo.d, memo.sets, memo.args = #rvm, #dvm, order, sets
    if #rvm > 0 then memo.last.r = vkeys[rvm[#rvm]].ready end
    if #dvm > 0 then memo.last.d = vkeys[dvm[#dvm]].delayed end
    q.memo = memo
    local woke = false
    local moved, head = index_moves(q.ck_index, rvm, rss)
    if moved then
      for _, vm in ipairs(moved) do hooks:ready_start(vm) end -- (see index_moves)
      redis.call('ZADD', q.master, 'LT', head, q.qm)
      woke = true
    end
    local head_n
    moved, head, head_n = index_moves(q.delay_index, dvm, dss)
    if moved and (redis.call('ZADD', q.master, 'LT', 'CH', head, q.qm) == 1 or not woke and place_soonest(q, head, now, head_n)) then
      woke = true
    end
    place_flush(q) -- (after the indexes' moves: it may widen them)
    return out, woke
  end
  out, woke = enqueue_batch()
else
  out, woke = enqueue_each()
end
if woke and wake ~= '' then redis.call('PUBLISH', wake, q.qm) end
hooks:finish()
return out
end

local function script_dequeue_vtime(keys, args)
KEYS, ARGV = keys, args
-- dequeue_vtime (scheduler flag on): ack the runs the call carries, then
-- serve up to maxCount ready runs of one base queue in fair virtual-time
-- order across its variants (start-time fair queuing; vtime/ is the model
-- this follows phase by phase: capacity, promote, ungate, discover, serve,
-- persist, rebase, expired), each moved in flight with a lease. Every serve
-- re-decides, so a variant may be served several times in one call and a
-- call of N serves what N calls of 1 would.
--
-- KEYS[1..11], ARGV[1..13+3a] -> see lib/dequeue
-- KEYS[12] -> queue ckVtime ZSET (see lib/sched_reg)
-- KEYS[13] -> queue scheduler state HASH (see lib/sched_reg)
-- KEYS[14] -> queue weights HASH (variant member -> weight)
-- ARGV[14+3a] -> scheduler state TTL (ms)
-- ARGV[15+3a] -> idle set cap
-- ARGV[16+3a] -> window multiplier
-- ARGV[17+3a] -> 1 when a freed slot looks for a gated variant (see
--                lib/hooks_vtime), else 0
-- KEYS[15] -> the env's waiting line ZSET (see lib/envwait), only with an env limit
-- KEYS[16] -> the line's HASH of lives and places, only with an env limit
-- ARGV[18+3a] -> the shard's wake-up channel, only with an env limit
-- ARGV[19+3a] -> the life of the call's waiting mark (ms), only with an env
--                limit; negative from a consumer leaving (maxCount 0: see
--                lib/envwait's ew_leave)
-- ARGV[20+3a] -> the leaving grace (ms), only with an env limit: a mark
--                with no more life left is passed over (lib/envwait)
-- Returns: see dq_finish (its first value -1 - the acks when the call found
-- the state broken and served nothing: see w_extend).
local OWN_KEYS = 11
local dq = dq_open(KEYS, ARGV)
local S = sched_open(KEYS[OWN_KEYS + 1], KEYS[OWN_KEYS + 2], KEYS[OWN_KEYS + 3],
                     ARGV[dq.own_args + 1], ARGV[dq.own_args + 2], dq.now)
local wm = ARGV[dq.own_args + 3] + 0
local G = 4503599627370496
-- capacity: the acks the call carries first (their slots count), then
-- what the env and queue limits leave of maxCount. The acks look for gated
-- variants as every flag-on ack does (see hooks_vtime): before the
-- capacity return and the promotion, which must see them un-gated.
local acked = {}
if dq.acks > 0 then -- (the hooks are closures: made only for acks)
  acked = dq_ack(dq, sched_hooks(S, dq.key_limit > 0 or ARGV[dq.own_args + 4] == '1'))
end
-- The env's free slots left to its queues that wait longer (lib/envwait).
dq_capacity(dq)
local ew = nil
if dq.env_limit > 0 then
  ew = ew_open(KEYS[OWN_KEYS + 4], KEYS[OWN_KEYS + 5], ARGV[dq.own_args + 5], ARGV[dq.own_args + 6],
               ARGV[dq.own_args + 7], dq)
  ew_capacity(ew)
end
if dq.cap <= 0 then
  if ew then ew_settle(ew, 0) end
  if S.st then sched_save(S) else sched_keep(S) end
  return dq_finish(dq, acked)
end
-- due TTL: whether the shard has runs past their TTL, which the call
-- sweeps when they come to the head of their variant (lib/dequeue's
-- dq_due and dq_head_due; vtime's sweepHead).
dq_due(dq)

-- promote: due delayed runs become ready; their variants register, all
-- together after it (nothing in the promotion reads the registrations).
-- lib/dequeue's dq_promote (head look, share plan, budget); when more
-- than scan variants are due, its pick looks at the first
-- 4 x scan (vtime.PromoteLook) and reaches first those with no ready run
-- (no ckIndex entry: nothing to serve until promoted), keeping scan/4
-- places for the others (whose due runs must not wait for ever either),
-- each group in delayIndex's order, one group filling the places the
-- other leaves (vtime's call.promote): a burst of many keys' delayed runs
-- falling due together no longer holds a key due behind it until every
-- earlier run is promoted. Those at their key limit with a ready run come
-- after all the others (and those without one after the others without
-- one), and while fewer than scan of those looked at are below their
-- limit the pick looks further (keys held at their limit
-- with due backlogs in front no longer shut a free key out).
-- The cold mark (vtime's call.promote): a call that reaches fewer variants
-- than are due (cut) on a cold state (the lane empty, no competing tag
-- above V) sets st.cm to the time the last of them fell due; a variant the promotion registers whose
-- first due run (its delayIndex score before the promotion) is at or
-- before the mark registers at V as a discovered one (found), not through
-- the lane: work due together on a cold state registers together, as if
-- the call had reached it all. A call that promotes and finds nothing due
-- by the mark left in delayIndex drops it (-1).
local promoted = sched_gather()
local cut, mark, found, last_due = false, -1, {}, -1
dq_promote(dq, promoted, function(look)
  cut = true
  -- (when the last of the due variants fell due, before any moves: the
  -- mark, not the call's own clock, which may run ahead of the producers')
  local last = redis.call('ZREVRANGEBYSCORE', dq.delay_index, dq.now_arg, '-inf', 'WITHSCORES', 'LIMIT', '0', '1')
  last_due = num(last[2])
  -- look holds the first scan + 1 due variants: read the rest of 4 x scan
  -- (vtime.PromoteLook); while those read hold fewer than scan below
  -- their key limit, the next 4 x scan, up to 10 looks, the last cut to
  -- 4,000 variants in all (vtime.PromoteLookMax: never less for a larger
  -- scan, so a coalesced call reaches as far as each of its calls)
  local scan = dq.scan
  local chunk = 4 * scan
  local reach = math.max(chunk, math.min(4000, 10 * chunk))
  local starving, fed, held_starving, held_fed = {}, {}, {}, {}
  local inflight = {} -- (read here, kept for those reached: dq_inflight)
  local function read(upto)
    if upto <= #look then return end
    local more = redis.call('ZRANGEBYSCORE', dq.delay_index, '-inf', dq.now_arg, 'LIMIT', #look, upto - #look)
    for i = 1, #more do look[#look + 1] = more[i] end
  end
  local function classify(from)
    for i = from, #look, 1000 do
      local to = math.min(i + 999, #look)
      -- (those at their key limit: nothing promoted for them can be
      -- served until a slot frees; with a ready run they have runs to
      -- serve then)
      local n = dq.key_limit > 0 and redis.call('HMGET', dq.kin, unpack(look, i, to))
      local heads = redis.call('ZMSCORE', dq.ck_index, unpack(look, i, to))
      for j = 1, #heads do
        local vm = look[i + j - 1]
        local g
        if n then inflight[vm] = tonumber(n[j]) or 0 end
        if n and inflight[vm] >= dq.key_limit then
          g = heads[j] and held_fed or held_starving
        else
          g = heads[j] and fed or starving
        end
        g[#g + 1] = vm
      end
    end
  end
  read(chunk)
  classify(1)
  local got = chunk
  while got < reach and #look == got and #starving + #fed < scan do
    local from = #look + 1
    got = math.min(reach, got + chunk)
    read(got)
    classify(from)
  end
  -- (the starving first, those below their limit before those at it,
  -- leaving scan/4 places to the fed below their limit when there are
  -- any, then those fed in the room left; then the fed at their limit)
  for _, vm in ipairs(held_starving) do starving[#starving + 1] = vm end
  for _, vm in ipairs(held_fed) do fed[#fed + 1] = vm end
  local s = math.min(#starving, scan - math.min(#fed, math.floor(scan / 4)))
  local f = math.min(#fed, scan - s)
  local due = {}
  for i = 1, s do due[i] = starving[i] end
  for i = 1, f do due[s + i] = fed[i] end
  for _, vm in ipairs(due) do
    if inflight[vm] then dq_var(dq, vm).inflight_n = inflight[vm] end
  end
  return due
end, function(due)
  -- the milli-weights of the variants to promote, in one read; the mark,
  -- and when it is set the first due run of each (before they move)
  local raw = sched_hmget(S.w, due)
  local ws = {}
  for i = 1, #due do ws[i] = sched_milli(raw[i]) end
  if S.st then mark = sched_state(S).cm else mark = tonumber(redis.call('HGET', S.h, 'cm')) or -1 end
  if mark >= 0 then
    for i = 1, #due, 1000 do
      local to = math.min(i + 999, #due)
      local at = redis.call('ZMSCORE', dq.delay_index, unpack(due, i, to))
      for j = 1, #at do
        if at[j] and num(at[j]) <= mark then found[due[i + j - 1]] = true end
      end
    end
  end
  return ws
end)
-- (cold as the state stood before the promotion's registrations, which
-- come next; nothing before them changed it)
local cold = false
if cut then
  local st0 = sched_state(S)
  cold = st0.lh == ''
  if cold then
    local t = redis.call('ZREVRANGEBYSCORE', S.z, '(1125899906842624', '0', 'WITHSCORES', 'LIMIT', '0', '1')
    cold = not t[2] or num(t[2]) <= st0.v
  end
end
if promoted[1] then sched_register_many(S, promoted, found) end
-- A queue without scheduler state (never used, or idle past StateTTL) and
-- with no ready run makes none: nothing can be served, and the first work
-- that becomes ready starts the state. So a poll of an empty queue writes
-- nothing, as with the flag off. (The read is the one sched_state makes;
-- the EXISTS only runs when the state is missing.)
if not S.st then
  local r = redis.call('HMGET', S.h, unpack(SCHED_FIELDS))
  if not r[1] and redis.call('EXISTS', dq.ck_index) == 0 then
    if ew then ew_settle(ew, 0) end
    return dq_finish(dq, acked)
  end
  sched_state(S, r, 0)
end
local st = sched_state(S)
if cut and cold then
  st.cm = math.max(st.cm, last_due)
elseif mark >= 0 then
  local h = redis.call('ZRANGE', dq.delay_index, '0', '0', 'WITHSCORES')
  if not h[2] or num(h[2]) > mark then st.cm = -1 end
end

-- Milli-weights, read once per variant (none when the queue has none).
local milli = {}
local function weight_of(vm)
  if milli[vm] == nil then milli[vm] = sched_weight(S, st, vm) end
  return milli[vm]
end

-- Variants this call reads or changes: vm -> { vm, member, code, u (tag),
-- r (stride remainder, nil until needed), gated, gone, new, hv (state-hash
-- value to write) }, and the order they were first changed in.
local ent, changed = {}, {}
local function touch(e)
  if not e.touched then
    e.touched = true
    changed[#changed + 1] = e
  end
end

-- ungate: when the key limit rose above the one the gated variants were
-- gated under (or went away), every gated variant returns, at max(S, V);
-- those still at the new limit are gated again when a call meets them.
local kl = dq.key_limit
if st.gk > 0 and (kl == 0 or kl > st.gk) then
  local raw = redis.call('ZRANGEBYSCORE', S.z, '4503599627370496', '+inf')
  local vms = {}
  for i = 1, #raw do vms[i] = sched_split(raw[i]) end
  local hvs = sched_hmget(S.h, vms)
  local zargs, hargs = {}, {}
  for i = 1, #vms do
    local rg = hvs[i] and sched_parse(hvs[i]) or { code = select(2, sched_split(raw[i])), r = 0 }
    local u, r = rg.tag, rg.r
    if not u or u < st.v then u, r = st.v, 0 end
    zargs[#zargs + 1] = sched_fmt(u)
    zargs[#zargs + 1] = raw[i]
    hargs[#hargs + 1] = vms[i]
    hargs[#hargs + 1] = sched_value(rg.code, false, false, r)
  end
  sched_chunked('ZADD', S.z, zargs, 2)
  sched_chunked('HSET', S.h, hargs, 2)
  st.ng, st.gk, st.gp = st.ng - #vms, kl, 0
end

-- ungate, probe: the first gated variant in gating order (gp keeps the
-- number looked at) returns if it is below its limit (a flag-off instance
-- freed its slot without saying); one still at its limit takes the next
-- gating number, behind every other gated variant (written at persist,
-- after the serves: see there). One look per call: a call costs the same
-- whatever the number of gated keys; the gated variants are a queue the
-- probe takes from the front, and one gated later joins it at the back, so
-- keys gated again at every call never keep the probe from coming back to
-- a variant (vtime's probeGated).
local probe_back = nil -- { score, member } of the variant moved back
do
  local raw = {}
  if st.ng > 0 then
    raw = redis.call('ZRANGEBYSCORE', S.z, '4503599627370496', '+inf', 'WITHSCORES', 'LIMIT', '0', '1')
  end
  if #raw == 0 then
    st.gp = 0
  else
    local vm, code = sched_split(raw[1])
    st.gp = num(raw[2]) - G
    if not dq_at_limit(dq, vm) then
      local hv = redis.call('HGET', S.h, vm)
      local rg = hv and sched_parse(hv) or { r = 0 }
      local u, r = rg.tag, rg.r
      if not u or u < st.v then u, r = st.v, 0 end
      redis.call('ZADD', S.z, sched_fmt(u), raw[1])
      redis.call('HSET', S.h, vm, sched_value(code, false, false, r))
      st.ng = st.ng - 1
    else
      probe_back = { sched_fmt(G + st.gn), raw[1] }
      st.gn = st.gn + 1
    end
  end
end

-- discover: scan variants of ckIndex at the rotating cursor; untagged ones
-- register. The state's first read that finds any of ckIndex records the
-- call's time (b). An untagged variant whose head run (its first ready
-- run, which the read looks up: dq_head, its record's available_at) became
-- available at or before b had its work ready before the state could see
-- it and registers at V (or its parked tag); any other became ready while
-- the state was there (a flag-off producer's new key) and registers by the
-- newcomer rule, as a flag-on enqueue would have (see vtime's discover).
local index_empty
do
  local list = redis.call('ZRANGE', dq.ck_index, st.c, st.c + dq.scan)
  index_empty = st.c == 0 and #list == 0
  local more = #list > dq.scan -- one more was read to know
  if more then list[#list] = nil end
  if st.b < 0 and #list > 0 then st.b = dq.now end
  local hvs = sched_hmget(S.h, list)
  local found, ids = {}, {}
  for i, vm in ipairs(list) do
    if not hvs[i] then
      found[#found + 1] = vm
      -- (no head: a stale ckIndex entry, a hand edit's; no record, old work)
      local _, id = dq_head(dq, vm)
      ids[#found] = id or ''
    end
  end
  if #found > 0 then
    -- (one batch: one read of the records and of the parked tags, one top
    -- read, the writes after; each registration sees the ones before it)
    local recs = sched_hmget(dq.runs, ids)
    local parked = sched_mread('ZMSCORE', S.z, found)
    local B = sched_batch()
    for i, vm in ipairs(found) do
      -- (a record that does not parse, or is gone, counts as old work: the
      -- serve that meets it deals with it)
      local at = recs[i] and rec_parse(recs[i]).at
      sched_admit_into(S, st, vm, not at or at + 0 <= st.b, parked[i], B)
    end
    sched_chunked('ZREM', S.z, B.zrem, 1)
    sched_chunked('ZADD', S.z, B.zadd, 2)
    sched_chunked('HSET', S.h, B.hset, 2)
  end
  -- The next call starts cap entries before the end of this chunk: a serve
  -- moves at most one variant from before an unread one to after it, so
  -- no variant whose head stays put slips past the cursor.
  if not more then
    st.c = 0
  else
    st.c = st.c + math.max(1, dq.scan - dq.cap)
  end
end

local lane_head0 = st.lh -- the lane's head as the call begins (it competes)

-- serve, pass 1: the active tags in (tag, registration) order, read lazily
-- into a window (W), as vtime's window does. Nothing of ckVtime's active
-- region is written until persist, so reads by rank stay consistent.
-- W is a span (lib/span): the list's entries are list[head..tail].
local W = { list = {}, head = 1, tail = 0, over = {}, read = 0, more = true, last = nil, first = dq.cap + 1,
            budget = 1000 + 4 * dq.max_count * wm }
-- (tag, registration) order; registration numbers compare as numbers.
local function before(a, b) return a.u < b.u or (a.u == b.u and a.seq < b.seq) end

-- A window entry for variant vm, seq code code, tag u.
local function entry(vm, code, u, member)
  return { vm = vm, member = member or code .. vm, code = code, seq = tonumber(code), u = u }
end

-- Put e in the list at its rank, whatever the bound.
local function w_place(e) span_place(W, e, before) end

-- Put e in the list when it sorts before the bound (the last entry read),
-- else in overflow until a read passes it; once the budget is spent no
-- read will, and e takes its rank in the list.
local function w_insert(e)
  if W.more and W.read > 0 and W.read < W.budget and before(W.last, e) then
    W.over[#W.over + 1] = e
    return
  end
  w_place(e)
end

local function w_remove(e)
  for i = W.head, W.tail do
    if W.list[i] == e then
      span_remove(W, i)
      return
    end
  end
end

-- Read the next chunk (first cap + 1 entries, then as many as were read,
-- within the budget; one more is peeked to know whether any are left).
-- The region's rank 0 is the sentinel: the first read takes it too and
-- returns nil when it is missing (a ckVtime lost without its hash).
local function w_extend()
  if not W.more or W.read >= W.budget then return false end
  local n = W.first
  if W.read > 0 then n = W.read end
  n = math.min(n, W.budget - W.read)
  local raw, skip = nil, 0 -- skip: values before the first entry
  if W.read == 0 then
    raw = redis.call('ZRANGEBYSCORE', S.z, '0', '(1125899906842624', 'WITHSCORES', 'LIMIT', '0', n + 2)
    if raw[1] ~= '' then return nil end
    skip = 2 -- the sentinel and its score
  else
    raw = redis.call('ZRANGEBYSCORE', S.z, '0', '(1125899906842624', 'WITHSCORES', 'LIMIT', W.read + 1, n + 1)
  end
  local got = (#raw - skip) / 2
  W.more = got > n
  local take = math.min(got, n)
  if take == 0 then return false end
  local e
  for i = 1, take do
    local member = raw[skip + 2 * i - 1]
    local vm, code = sched_split(member)
    e = entry(vm, code, num(raw[skip + 2 * i]), member)
    e.waiting = e.vm == lane_head0
    e.waiting0 = e.waiting
    ent[e.vm] = e
    W.tail = W.tail + 1
    W.list[W.tail] = e
  end
  W.read = W.read + take
  W.last = { u = e.u, seq = e.seq }
  local over = W.over
  W.over = {}
  for _, e in ipairs(over) do w_insert(e) end
  return true
end

-- The newcomer lane: its head competes, the others wait in registration
-- order (the lane region holds them all; nothing writes it before
-- persist, so ranks stay put). When the head leaves it, the next one
-- competes at max(V, t): t is its quantum past the old head's serve at
-- start (served), or the old head's tag (start).
local lane_left = 0
local function lane_leave(e, start, served)
  if not e.waiting then return end
  e.waiting = false
  st.lh = ''
  lane_left = lane_left + 1
  local nxt = sched_lane_at(S, lane_left)
  if not nxt then return end
  local t = start
  if served then t = t + sched_quantum(weight_of(nxt)) end
  local h = entry(nxt, sched_parse(redis.call('HGET', S.h, nxt)).code, math.max(st.v, t))
  h.r, h.r0, h.waiting, h.waiting0 = 0, 0, true, true
  st.lh = nxt
  ent[nxt] = h
  touch(h)
  w_insert(h)
end

local parked = {}
local function gate(e)
  e.gated, e.gate = true, st.gn
  st.gn = st.gn + 1
  st.gk = kl
  st.ng = st.ng + 1
  touch(e)
  lane_leave(e, e.u)
end

local function leave(e)
  e.gone = true
  touch(e)
  lane_leave(e, e.u)
  if e.u > st.v then
    e.parked = true
    parked[#parked + 1] = e
  end
end

-- The first servable entry; stale entries (no ready run: a flag-off drain
-- left them) are collected and those at their key limit gated, for good.
local function pick()
  while true do
    while W.head <= W.tail do
      local e = W.list[W.head]
      if dq_head(dq, e.vm) == nil then
        span_remove(W, W.head)
        leave(e)
      elseif dq_at_limit(dq, e.vm) then
        span_remove(W, W.head)
        gate(e)
      else
        return e
      end
    end
    if not w_extend() then return nil end
  end
end

-- serve, age head (once, when pass 1 runs dry): the first scan variants of
-- ckIndex as it stood when serving began (nothing writes it before
-- dq_finish) that this call has not seen and that still have a ready run:
-- untagged ones register at V or their parked tag, competing ones that
-- pass 1 did not reach (it stopped at its budget) join as they are, and
-- for one queued in the lane behind its head, the lane's head joins (the
-- lane keeps its order); all at their rank whatever the window's bound.
-- Gated ones are left to the probe, so an all-gated queue costs the same
-- whatever the number of keys.
local function age_head()
  local list = redis.call('ZRANGE', dq.ck_index, '0', dq.scan - 1)
  local need = {}
  for _, vm in ipairs(list) do
    if ent[vm] == nil then need[#need + 1] = vm end
  end
  local vals = sched_hmget(S.h, need)
  for i, vm in ipairs(need) do
    local rg = vals[i] and sched_parse(vals[i])
    -- (ent: the lane's head may have joined for a member met before it)
    if ent[vm] == nil and not (rg and rg.gated) and dq_head(dq, vm) ~= nil then
      local e
      if not rg then
        local u, code = sched_admit(S, st, vm, true)
        e = entry(vm, code, u)
        e.r, e.new = 0, true
        touch(e)
      elseif rg.waiting and vm ~= st.lh then
        local h = st.lh
        if h ~= '' and ent[h] == nil then
          local code = sched_parse(redis.call('HGET', S.h, h)).code
          e = entry(h, code, num(redis.call('ZSCORE', S.z, code .. h)))
          e.waiting, e.waiting0 = true, true
          vm = h
        end
      else
        e = entry(vm, rg.code, num(redis.call('ZSCORE', S.z, rg.code .. vm)))
        e.waiting, e.waiting0 = rg.waiting, rg.waiting
      end
      if e and e.u == nil then -- its tag went missing (a hand edit): at V
        e.u, e.r, e.r0 = st.v, 0, 0
        touch(e)
      end
      if e then
        ent[vm] = e
        w_place(e)
      end
    end
  end
end


-- The stride remainder of e: only a weight other than 1 leaves one.
local function remainder(e, mw)
  if e.r == nil then
    e.r = 0
    if mw ~= 1000 then
      local hv = redis.call('HGET', S.h, e.vm)
      if hv then e.r = sched_parse(hv).r end
    end
    e.r0 = e.r
  end
  return e.r
end

-- E = max(S, V), V = max(V, E), S = E + stride (exact: quotient and
-- remainder of 10^9 / milli-weight).
local function serve_one(e)
  w_remove(e) -- out of the window while its tag changes
  local mw = weight_of(e.vm)
  local eu, er = e.u, remainder(e, mw)
  if eu < st.v then eu, er = st.v, 0 end
  if eu > st.v then st.v = eu end
  if er >= mw then er = 0 end
  local q, r = sched_div(er + 1000000000, mw)
  e.u, e.r = eu + q, r
  touch(e)
  -- The lane's head is served: it leaves the lane, and the next newcomer
  -- competes one quantum of its own behind this serve.
  lane_leave(e, eu, true)
  local nxt = dq_take(dq, e.vm)
  if nxt == nil then
    leave(e)
  elseif dq_at_limit(dq, e.vm) then
    gate(e)
  else
    w_insert(e)
  end
end

-- Sweep the head run of e's variant when its TTL passed (dq_head_due;
-- vtime's sweepOne): no serve, nothing of the scheduler moves;
-- the variant keeps its place in the window, or, when that was its last
-- ready run, leaves it as a stale entry does (pick).
local function sweep_one(e)
  if not dq_head_due(dq, e.vm) then return false end
  if dq_take(dq, e.vm, true) == nil then
    w_remove(e)
    leave(e)
  end
  return true
end

if w_extend() == nil then
  -- No sentinel: the state is broken. It goes whole, nothing is served,
  -- and the reply says so (its first value -1 - the acks) so that the
  -- caller calls again at once, on a state started again.
  sched_broken(S)
  local out = dq_finish(dq, acked)
  out[1] = -1 - out[1]
  return out
end
local age_done = index_empty -- nothing for the age head to read
while #dq.served - dq.nswept < dq.cap do
  local e = pick()
  if e == nil and not age_done then
    age_done = true
    age_head()
    e = pick()
  end
  if e == nil then break end
  if not sweep_one(e) then serve_one(e) end
end

-- The served runs move in flight first (dq_finish), the scheduler's writes
-- after: on a Redis at maxmemory a script is refused only at its first
-- write that may add memory, and a serve's first write removes runs from
-- their ready sets, so a full Redis still hands out runs, whose acks free
-- memory (as with the flag off).
local out = dq_finish(dq, acked)
if ew then ew_settle(ew, #dq.served - dq.nswept) end

-- collect and persist: the tags and registrations this call changed
-- (gathered from the entries it touched), then parked tags.
-- A variant that left the lane leaves its region (unless parking replaces
-- the entry: the member is the same).
do
  local zargs, hargs, zrem, hdel, iargs = {}, {}, {}, {}, {}
  for _, e in ipairs(changed) do
    if e.waiting0 and not e.waiting and not e.parked then zrem[#zrem + 1] = e.vm end
    if e.gone then
      if not e.new then
        zrem[#zrem + 1] = e.member
        hdel[#hdel + 1] = e.vm
      end
    else
      local score = e.u
      if e.gated then score = G + e.gate end
      zargs[#zargs + 1] = sched_fmt(score)
      zargs[#zargs + 1] = e.member
      if e.r == nil then
        -- Gated without a serve: keep the remainder it has.
        local hv = redis.call('HGET', S.h, e.vm)
        e.r = 0
        if hv then e.r = sched_parse(hv).r end
        e.r0 = e.r
      end
      local r = e.r
      if e.new or e.gated or r ~= (e.r0 or 0) or e.waiting ~= e.waiting0 then
        hargs[#hargs + 1] = e.vm
        hargs[#hargs + 1] = sched_value(e.code, e.gated, e.waiting, r, e.u)
      end
    end
  end
  for _, e in ipairs(parked) do
    iargs[#iargs + 1] = sched_fmt(e.u - G)
    iargs[#iargs + 1] = e.vm
  end
  if probe_back then -- (a gated variant: nothing above touched it)
    zargs[#zargs + 1] = probe_back[1]
    zargs[#zargs + 1] = probe_back[2]
  end
  sched_chunked('ZREM', S.z, zrem, 1)
  sched_chunked('HDEL', S.h, hdel, 1)
  sched_chunked('ZADD', S.z, zargs, 2)
  sched_chunked('HSET', S.h, hargs, 2)
  if #iargs > 0 then
    sched_chunked('ZADD', S.z, iargs, 2)
    sched_reap(S, st.v)
  end
end

-- rebase: once V reaches 2^49, every stored time moves down 2^48 (tags
-- more than 2^47 below V first rise to it: they are worth V either way).
if st.v >= 562949953421312 then
  sched_reap(S, st.v)
  local lo = st.v - 140737488355328
  local zargs, hargs = {}, {}
  local raw = redis.call('ZRANGEBYSCORE', S.z, '0', '(1125899906842624', 'WITHSCORES')
  table.remove(raw, 1) -- the sentinel (rank 0) stays at 0
  table.remove(raw, 1)
  for i = 1, #raw, 2 do
    local u = num(raw[i + 1])
    if u < lo then
      u = lo
      local vm, code = sched_split(raw[i])
      hargs[#hargs + 1] = vm
      hargs[#hargs + 1] = sched_value(code, false, vm == st.lh, 0)
    end
    zargs[#zargs + 1] = sched_fmt(u - 281474976710656)
    zargs[#zargs + 1] = raw[i]
  end
  -- Gated tags live in the state hash (their scores are gating numbers).
  local gated = redis.call('ZRANGEBYSCORE', S.z, '4503599627370496', '+inf')
  local gvms = {}
  for i = 1, #gated do gvms[i] = sched_split(gated[i]) end
  local gvals = sched_hmget(S.h, gvms)
  for i, vm in ipairs(gvms) do
    if gvals[i] then
      local rg = sched_parse(gvals[i])
      local u, r = rg.tag or lo, rg.r
      if u < lo then u, r = lo, 0 end
      hargs[#hargs + 1] = vm
      hargs[#hargs + 1] = sched_value(rg.code, true, false, r, u - 281474976710656)
    end
  end
  local idle = redis.call('ZRANGEBYSCORE', S.z, '-4503599627370496', '(-3377699720527872', 'WITHSCORES')
  for i = 1, #idle, 2 do
    zargs[#zargs + 1] = sched_fmt(num(idle[i + 1]) - 281474976710656)
    zargs[#zargs + 1] = idle[i]
  end
  sched_chunked('ZADD', S.z, zargs, 2)
  sched_chunked('HSET', S.h, hargs, 2)
  st.v = st.v - 281474976710656
  st.e = st.e + 1
end

-- expired: the runs taken whose TTL passed (dq_finish; not those swept)
-- free their slots
-- as an ack sent right after the call would (vtime's expireTaken): a
-- variant gated at its key limit for them competes again.
if dq.expired_vms and (kl > 0 or ARGV[dq.own_args + 4] == '1') then sched_released(S, dq.expired_vms, true) end

sched_save(S)
return out
end

local function script_ack_vtime(keys, args)
KEYS, ARGV = keys, args
-- ack: runs of one base queue are done; each is removed everywhere and its
-- concurrency released. A run that no longer exists is done already (an
-- ack whose first call went through and was sent again finds it so).
--
-- KEYS[1] -> queue runs HASH (encoded id -> record)
-- KEYS[2] -> queue held HASH ("<variant member>:<encoded id>" -> delivery token)
-- KEYS[3] -> queue key-inflight HASH (variant member -> runs in flight)
-- KEYS[4] -> env in-flight counter STRING
-- KEYS[5] -> shard leases ZSET (run member, score lease deadline ms)
-- ARGV[1] -> now (ms)
-- ARGV[2] -> run member prefix (encoded env ":" encoded queue ":")
-- ARGV[3] -> n, the number of runs (at most 1000)
-- ARGV[4+3i..6+3i] -> run i: variant member, encoded id, delivery token
-- Flag on: KEYS[6..8] and ARGV[4+3n..6+3n] follow, the scheduler's (see
-- lib/hooks_vtime).
-- Returns: one value per run: 1 acked, 0 gone already, "not_found" (the
-- run exists under another key), "not_in_flight" or "lease_lost".
local k = { runs = KEYS[1], held = KEYS[2], kin = KEYS[3], env_n = KEYS[4], leases = KEYS[5] }
local now, n = ARGV[1] + 0, ARGV[3] + 0 -- (see num in lib/record)
local OWN_KEYS, OWN_ARGS = 5, 3 + 3 * n
local hooks = hooks_open(KEYS, ARGV, OWN_KEYS, OWN_ARGS, now)
local out = held_ack(k, ARGV[2], ARGV, 4, n, now, hooks)
hooks:finish()
return out
end

local function script_requeue_vtime(keys, args)
KEYS, ARGV = keys, args
-- requeue: a held run goes back to its variant (nack, or lease recovery
-- when its lease passed), attempt + 1, or to the dead letter when it has no
-- attempts left or the caller asks for it.
--
-- KEYS[1] -> queue runs HASH (encoded id -> record)
-- KEYS[2] -> queue ckIndex ZSET
-- KEYS[3] -> queue delayIndex ZSET
-- KEYS[4] -> queue depth HASH
-- KEYS[5] -> shard master ZSET
-- KEYS[6] -> queue held HASH ("<variant member>:<encoded id>" -> delivery token)
-- KEYS[7] -> queue key-inflight HASH (variant member -> runs in flight)
-- KEYS[8] -> env in-flight counter STRING
-- KEYS[9] -> shard leases ZSET
-- KEYS[10] -> queue dead ZSET (run member, score time of death ms)
-- KEYS[11] -> env dead HASH (queue member -> dead-lettered runs)
-- ARGV[1] -> now (ms)
-- ARGV[2] -> encoded message id
-- ARGV[3] -> variant member
-- ARGV[4] -> run member
-- ARGV[5] -> delivery token of the holder; 0 to recover an expired lease
-- ARGV[6] -> retry at (ms)
-- ARGV[7] -> priority step (ms)
-- ARGV[8] -> max attempts, 0 for no limit
-- ARGV[9] -> 1 to dead-letter now
-- ARGV[10] -> queue member
-- ARGV[11] -> wake channel ("" to not publish)
-- ARGV[12] -> variant key base (keys.Queue.VariantBase)
-- Flag on: KEYS[12..14] and ARGV[13..15] follow, the scheduler's (see
-- lib/hooks_vtime).
-- Returns: {1, attempt} requeued, {0, attempt} dead-lettered ({0, 0}: a
-- run whose record does not parse, by lease recovery or kill). A nack sent
-- again after its first call went through (the record's last settled token
-- is the holder's) returns what the first returned, and when requeued the
-- time the first set (the record's available_at) as a third value: the
-- retry's own retry time was computed later; a nack of a delivery
-- whose lease was recovered is RQ_NOT_IN_FLIGHT (or RQ_LEASE_LOST once the
-- run is delivered again).
-- Errors: RQ_NOT_FOUND (also when the run is held but its record is gone,
-- evicted: the hold is released), RQ_NOT_IN_FLIGHT, RQ_LEASE_LOST,
-- RQ_LEASE_ACTIVE, RQ_CORRUPT (a nack that would retry a run whose record
-- does not parse; nothing written).
local q = { runs = KEYS[1], ck_index = KEYS[2], delay_index = KEYS[3], depth = KEYS[4],
            master = KEYS[5], qm = ARGV[10] }
local held, kin, env_n, leases, dead, env_dead = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]
local now = ARGV[1] + 0 -- (client-written integers: see num in lib/record)
local id, vm, member, token, retry_at = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local priority_step, max_attempts, kill = ARGV[7] + 0, ARGV[8] + 0, ARGV[9] == '1'
local wake = ARGV[11]
local OWN_KEYS, OWN_ARGS = 11, 12
local hooks = hooks_open(KEYS, ARGV, OWN_KEYS, OWN_ARGS, now)

local _, err = held_check(q.runs, held, leases, vm, id, member, token, now)
if err == 'not_in_flight' and token ~= '0' then
  local r = rec_parse(redis.call('HGET', q.runs, id))
  if r.lt == token then
    if redis.call('ZSCORE', dead, member) then return { 0, r.att } end
    return { 1, r.att, r.at + 0 }
  end
end
-- A lease recovery (token 0) that finds a lease, passed, of a run that is
-- not held: the queue's held hash was lost (deleted by hand, evicted under
-- Config.AllowEviction) while the run was in flight, since every script
-- writes a hold and its lease together. Nothing else would ever remove
-- that lease: refused, it stayed due at the head of the shard's leases,
-- met first by every sweep (a sweep of limit n recovered nothing once n
-- such leases were due), and the run's key and env slots stayed taken for
-- ever. It is recovered as a held run is (its slots released, the run
-- requeued with attempt + 1, or released only when its record is gone
-- too). A run that is queued or dead again, or whose id is another key's
-- now (its record lost too, and the id enqueued again), is not that
-- delivery's (detached): the lease and the slots it stood for are
-- released as for a run without a record, and nothing else (every script
-- that releases a run's slots removes its lease in the same call, so a
-- lease left means its slots are still counted).
local detached = false
if token == '0' and (err == 'not_in_flight' or err == 'gone' or err == 'not_found') then
  local d = redis.call('ZSCORE', leases, member)
  if d and d + 0 <= now then
    local vk = variant_keys(ARGV[12], vm)
    detached = err == 'not_found' or err == 'not_in_flight' and (redis.call('ZSCORE', vk.ready, id)
        or redis.call('ZSCORE', vk.delayed, id) or redis.call('ZSCORE', dead, member))
    err = nil
  end
end
if err then return redis.error_reply(HELD_ERRORS[err]) end
-- The record is read before anything is written. One that does not parse
-- (a hand edit, a writer's bug) cannot be retried: a nack that would retry
-- it is refused with everything left as it was (the run held, its lease in
-- place), and a nack that dead-letters it (kill: the dequeue that served
-- it does so at once) and a lease recovery dead-letter the run with its
-- record as it is (below), where Purge can remove it and Redrive serve it
-- once it is mended. (A recovery that refused it would meet it first in
-- every sweep of its shard, its lease deadline passed, for ever.)
local rec = redis.call('HGET', q.runs, id)
local r = rec and rec_parse(rec)
if detached or r and r.att and r.vm ~= vm then
  -- (or a hold of another variant than the record's: a member added by
  -- hand to another key's ready set under a live run's id, served there,
  -- the dequeue's kill of it by its names as stored). Only the hold goes,
  -- as for a run without a record: the record is not this delivery's.
  rec, r = nil, nil
end
if r and not r.att and token ~= '0' and not kill then return redis.error_reply('RQ_CORRUPT run record does not parse') end
redis.call('HDEL', held, vm .. ':' .. id)
redis.call('ZREM', leases, member)
held_left(held, kin, kin_release(kin, { vm }, { [vm] = 1 }))
env_release(env_n, 1)
hooks:released({ vm })
if not rec then
  -- Held without a record: the runs hash was evicted (Config.AllowEviction).
  -- The run is gone; its lease and slot are released above.
  hooks:finish()
  return redis.error_reply(HELD_ERRORS.gone)
end
-- (a record that does not parse, on a lease recovery: dead-lettered as it
-- is, attempt 0)
local att = r.att and r.att + 1 or 0
-- The last settled token (lt in lib/record) is the caller's: the holder's
-- when it nacks (held_check found it held), 0 for a lease recovery, so
-- that neither the holder's nack, sent late, nor a retry of a nack that
-- settled an earlier stay is taken for a retry of a nack that settled this
-- one.
if not r.att or kill or (max_attempts > 0 and att > max_attempts) then
  if r.att then redis.call('HSET', q.runs, id, rec_with(rec, r, att, r.at, token)) end
  redis.call('ZADD', dead, now, member)
  redis.call('HINCRBY', env_dead, q.qm, '1')
  hooks:finish()
  return { 0, att }
end
redis.call('HSET', q.runs, id, rec_with(rec, r, att, retry_at, token))
local v = variant_keys(ARGV[12], vm)
if place(q, v, hooks, id, vm, retry_at, retry_at - r.pr * priority_step, now) and wake ~= '' then
  redis.call('PUBLISH', wake, q.qm)
end
hooks:finish()
return { 1, att }
end

local function script_expire_vtime(keys, args)
KEYS, ARGV = keys, args
-- expire: TTL sweep of one queued run whose deadline passed.
--
-- KEYS[1] -> queue runs HASH (encoded id -> record)
-- KEYS[2] -> queue ckIndex ZSET
-- KEYS[3] -> queue delayIndex ZSET
-- KEYS[4] -> queue depth HASH
-- KEYS[5] -> shard master ZSET
-- KEYS[6] -> shard ttl ZSET (run member, score expiry deadline ms)
-- ARGV[1] -> now (ms)
-- ARGV[2] -> encoded message id
-- ARGV[3] -> variant member
-- ARGV[4] -> run member
-- ARGV[5] -> queue member
-- ARGV[6] -> variant key base (keys.Queue.VariantBase)
-- Flag on: KEYS[7..9] and ARGV[7..9] follow, the scheduler's (see
-- lib/hooks_vtime).
-- Returns: 1 expired, 0 nothing to expire (gone, in flight, dead, or not
-- yet due). The dequeue drops the ttl entry of each run it serves and a
-- delivered run's record has no deadline, so an entry left behind (a run
-- acked or deleted meanwhile) finds no deadline here and just goes.
local q = { runs = KEYS[1], ck_index = KEYS[2], delay_index = KEYS[3], depth = KEYS[4],
            master = KEYS[5], qm = ARGV[5] }
local ttl_set = KEYS[6]
local now = ARGV[1] + 0 -- (client-written integers: see num in lib/record)
local id, vm, member = ARGV[2], ARGV[3], ARGV[4]
local OWN_KEYS, OWN_ARGS = 6, 6
local hooks = hooks_open(KEYS, ARGV, OWN_KEYS, OWN_ARGS, now)

local rec = redis.call('HGET', q.runs, id)
local r = rec and rec_parse(rec)
if not r or r.vm ~= vm or r.ttl == '0' then
  redis.call('ZREM', ttl_set, member)
  return 0
end
if tonumber(r.ttl) > now then return 0 end
redis.call('ZREM', ttl_set, member)
if not unplace(q, variant_keys(ARGV[6], vm), hooks, id, vm) then return 0 end
redis.call('HDEL', q.runs, id)
hooks:finish()
return 1
end

local function script_redrive_vtime(keys, args)
KEYS, ARGV = keys, args
-- redrive: a dead-lettered run goes back to its variant, ready now, with
-- its attempts reset.
--
-- KEYS[1] -> queue runs HASH (encoded id -> record)
-- KEYS[2] -> queue ckIndex ZSET
-- KEYS[3] -> queue delayIndex ZSET
-- KEYS[4] -> queue depth HASH
-- KEYS[5] -> shard master ZSET
-- KEYS[6] -> queue dead ZSET
-- KEYS[7] -> env dead HASH (queue member -> dead-lettered runs)
-- ARGV[1] -> now (ms)
-- ARGV[2] -> encoded message id
-- ARGV[3] -> variant member
-- ARGV[4] -> run member
-- ARGV[5] -> priority step (ms)
-- ARGV[6] -> queue member
-- ARGV[7] -> wake channel ("" to not publish)
-- ARGV[8] -> variant key base (keys.Queue.VariantBase)
-- Flag on: KEYS[8..10] and ARGV[9..11] follow, the scheduler's (see
-- lib/hooks_vtime).
-- Returns: 1 redriven, 2 already live (queued or in flight: a redrive sent
-- again after its first call went through finds it so).
-- Errors: RQ_NOT_FOUND.
local q = { runs = KEYS[1], ck_index = KEYS[2], delay_index = KEYS[3], depth = KEYS[4],
            master = KEYS[5], qm = ARGV[6] }
local dead, env_dead = KEYS[6], KEYS[7]
local now = ARGV[1] + 0 -- (client-written integers: see num in lib/record)
local id, vm, member = ARGV[2], ARGV[3], ARGV[4]
local priority_step = ARGV[5] + 0
local wake = ARGV[7]
local OWN_KEYS, OWN_ARGS = 7, 8
local hooks = hooks_open(KEYS, ARGV, OWN_KEYS, OWN_ARGS, now)

local rec = redis.call('HGET', q.runs, id)
local r = rec and rec_parse(rec)
if not r or r.vm ~= vm then return redis.error_reply('RQ_NOT_FOUND no such run') end
if redis.call('ZREM', dead, member) == 0 then return 2 end
if redis.call('HINCRBY', env_dead, q.qm, '-1') <= 0 then redis.call('HDEL', env_dead, q.qm) end
-- (no last settled token: a retry of the nack that dead-lettered it is
-- not answered from the redriven run)
-- (the time as Go wrote it, ARGV[1]: a Lua number joined to a string
-- prints as %.14g, 1.5e+14 from 1e14 ms on, which no reader parses)
redis.call('HSET', q.runs, id, rec_with(rec, r, 1, ARGV[1], '0'))
place(q, variant_keys(ARGV[8], vm), hooks, id, vm, now, now - r.pr * priority_step, now)
if wake ~= '' then redis.call('PUBLISH', wake, q.qm) end
hooks:finish()
return 1
end

redis.register_function{ function_name = 'runqueue_31092a987506af41_enqueue_vtime', callback = script_enqueue_vtime }
redis.register_function{ function_name = 'runqueue_31092a987506af41_dequeue_vtime', callback = script_dequeue_vtime, flags = { 'allow-oom' } }
redis.register_function{ function_name = 'runqueue_31092a987506af41_ack_vtime', callback = script_ack_vtime, flags = { 'allow-oom' } }
redis.register_function{ function_name = 'runqueue_31092a987506af41_requeue_vtime', callback = script_requeue_vtime, flags = { 'allow-oom' } }
redis.register_function{ function_name = 'runqueue_31092a987506af41_expire_vtime', callback = script_expire_vtime, flags = { 'allow-oom' } }
redis.register_function{ function_name = 'runqueue_31092a987506af41_redrive_vtime', callback = script_redrive_vtime, flags = { 'allow-oom' } }
