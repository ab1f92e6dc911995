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
      -- The fair scheduler's state in Redis (flag on only): lib/sched_reg (the
      -- layout, the state's scalars, registration) and the rest of what the
      -- scripts that serve, drain and release variants do. vtime/ is the model
      -- these functions implement; see vtime/doc.go for the rules.
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
