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
