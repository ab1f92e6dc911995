-- An env's waiting line (layout 8): the queues of an env with a limit that
-- wait for its slots, read and woken (lib/envwait keeps the marks: what a
-- mark is, when a dequeue writes one, when one is live, leaving or dead).
-- A ZSET (member: a queue's member, score: its place) and a HASH beside
-- it (the queue's member -> the time its mark lives until, in ms of
-- Redis's TIME; "#" -> the last place given). Included by lib/envwait and
-- by lib/hooks_vtime, whose acks and requeues wake the line for the slots
-- they free.

local EW_WAKE_MAX = 16

local function ew_open(line, lives, wake, life, grace, dq)
  return { line = line, lives = lives, wake = wake, life = life + 0, grace = grace + 0, dq = dq,
    now = nil,     -- TIME (ms), read once a mark is to be read or written
    mine = nil,    -- this queue's live place
    till = 0,      -- and the life of its mark then
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

-- The env's free slots now.
local function ew_free(dq)
  return dq.env_limit - (tonumber(redis.call('GET', dq.env_n)) or 0)
end

local function ew_drop(ew, members)
  redis.call('ZREM', ew.line, unpack(members))
  redis.call('HDEL', ew.lives, unpack(members))
  if redis.call('ZCARD', ew.line) == 0 then redis.call('DEL', ew.line, ew.lives) end
end

-- Up to n live marks of the line with a place in (lo, hi], in place
-- order, passing over the leaving ones and dropping the dead ones met (at
-- most 4 reads).
local function ew_live(ew, lo, hi, n)
  local now = ew_time(ew)
  local out, passed = {}, 0
  for _ = 1, 4 do
    if #out >= n then break end
    -- (a read asks for as many more as it passed marks, which stay, the
    -- leaving ones above all: else a few of them use up the reads before
    -- the live ones behind, 4 at one free slot: helper-206)
    local want = n - #out + passed
    local batch = redis.call('ZRANGEBYSCORE', ew.line, lo, hi, 'LIMIT', #out + passed, want)
    if #batch == 0 then break end
    local lives = redis.call('HMGET', ew.lives, unpack(batch))
    local dead = {}
    for i, m in ipairs(batch) do
      local till = tonumber(lives[i]) -- (nil, dead, for a life that is not a number: a hand edit)
      if not till or till < now then
        dead[#dead + 1] = m
      elseif till - now > ew.grace then
        if #out < n then out[#out + 1] = m else passed = passed + 1 end
      else
        passed = passed + 1
      end
    end
    if #dead > 0 then ew_drop(ew, dead) end
    if #batch < want then break end
  end
  return out
end

-- Wakes up to n live marks with a place in (lo, hi] (ew_live; at most
-- EW_WAKE_MAX) and returns how many live marks it found: the env's free
-- slots go to them.
local function ew_wake_live(ew, lo, hi, n)
  local marks = ew_live(ew, lo, hi, n)
  for i = 1, math.min(#marks, EW_WAKE_MAX) do redis.call('PUBLISH', ew.wake, marks[i]) end
  return #marks
end
