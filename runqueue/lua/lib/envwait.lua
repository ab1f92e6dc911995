-- The queues waiting for a slot of their env (layout 8; flag-on dequeues
-- with an env limit only). An env's limit is shared by its queues, and a
-- dequeue serves one queue: without this, a consumer that acks and takes
-- in one call takes back every slot its acks free, and another queue of
-- the env at its limit waits until that queue's backlog drains.
--
-- The env's waiting HASH holds a field per waiting queue: its member ->
-- "<turn>:<until>": its place in the line and, in ms of Redis's own clock
-- (TIME: the callers' clocks may disagree), live until; and the field "#",
-- the last place given (a queue member always holds a ':').
-- A dequeue whose call the env's limit held to less than it could take
-- otherwise (the queue's limit and maxCount), and that leaves ready runs
-- behind, marks its queue: the place is kept while the queue waits without
-- being served, and a new one (the back of the line) is taken when it was
-- served or had none. A dequeue that the env does not hold so, or that
-- leaves nothing ready, drops its mark (and the hash with the last one).
-- A mark past its until is dead (its consumer gone or gone quiet) and
-- dropped by the next call that reads it; a waiter renews it at each call
-- (until: TIME + the caller's mark life, twice its poll interval and a
-- second). The hash expires with its longest-lived mark.
--
-- Every dequeue of the env's queues leaves a free slot to each live mark
-- of another queue ahead of its own in the line (to every one when it has
-- none) and publishes a wake-up to the first of them; a call that used
-- fewer of the slots left to it wakes as many queues behind it (a waiting
-- queue whose ready runs cannot be served, all of their keys at their
-- limit, passes its turn on). At most EW_WAKE_MAX wake-ups a call.
--
-- The line holds at most EW_MARKS_MAX queues (a call reads it whole): a
-- queue that finds it full waits outside, as before the line (its poll),
-- and a queue in a full line that was served leaves it rather than taking
-- a new place, so the queues outside come in.
--
-- The marks are best effort: their writes go by pcall, so that on a Redis
-- at maxmemory (where a script run by EVALSHA is refused at its first write
-- that may add memory) a held dequeue still returns, serving nothing, as it
-- did before the line.

local EW_WAKE_MAX = 16
local EW_MARKS_MAX = 64

local function ew_open(key, wake, life, dq)
  return { key = key, wake = wake, life = life + 0, dq = dq,
    now = nil,     -- TIME (ms), read once a mark is to be read or written
    mine = nil,    -- this queue's live place
    live = 0,      -- live marks (this queue's included)
    last = 0,      -- the latest until of the live marks
    behind = {},   -- live marks of other queues after this queue's, by place
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

local function ew_wake(ew, marks, n)
  for i = 1, math.min(#marks, n, EW_WAKE_MAX) do redis.call('PUBLISH', ew.wake, marks[i][1]) end
end

-- A write that may be refused on a full Redis: nil then.
local function ew_write(...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then return nil end
  return r
end

-- After dq_capacity: dq.cap less the env's free slots left to the queues
-- that wait ahead. An ack-only call (maxCount 0) wakes them and changes
-- no mark.
local function ew_capacity(ew)
  local dq = ew.dq
  local raw = redis.call('HGETALL', ew.key)
  if #raw == 0 then
    -- No queue waits: nothing to leave or wake, no mark to keep. Whether
    -- the env held the call is read after the serves, and only when the
    -- call used all its room (ew_settle).
    ew.lazy = true
    return
  end
  local now = ew_time(ew)
  local free = dq.env_limit - (tonumber(redis.call('GET', dq.env_n)) or 0)
  local others, dead = {}, {}
  for i = 1, #raw, 2 do
    if raw[i] ~= '#' then
      local turn, till = string.match(raw[i + 1], '^(%d+):(%d+)$')
      if turn == nil or till + 0 < now then
        dead[#dead + 1] = raw[i]
      else
        ew.live = ew.live + 1
        ew.last = math.max(ew.last, till + 0)
        if raw[i] == dq.qm then ew.mine = turn + 0 else others[#others + 1] = { raw[i], turn + 0 } end
      end
    end
  end
  if #dead > 0 then
    if ew.live == 0 then redis.call('DEL', ew.key) else redis.call('HDEL', ew.key, unpack(dead)) end
  end
  table.sort(others, function(a, b) return a[2] < b[2] end)
  local ahead = others
  if ew.mine ~= nil then
    ahead = {}
    for _, o in ipairs(others) do
      if o[2] < ew.mine then ahead[#ahead + 1] = o else ew.behind[#ew.behind + 1] = o end
    end
  end
  if #ahead > 0 and free > 0 then ew_wake(ew, ahead, free) end
  if dq.max_count <= 0 then return end
  ew.room = free - #ahead
  -- What the call could take but for the env: maxCount within the
  -- queue's limit.
  local other = dq.max_count
  if dq.queue_limit > 0 then other = math.min(other, dq.queue_limit - held_count(dq.held)) end
  ew.held = ew.room < other
  if ew.room < dq.cap then dq.cap = math.max(ew.room, 0) end
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
    if dq.env_limit - (tonumber(redis.call('GET', dq.env_n)) or 0) > 0 then return end
    if dq.queue_limit > 0 and dq.queue_limit - held_count(dq.held) <= 0 then return end
    ew.held, ew.room = true, served
  end
  local stay = ew.held and served >= ew.room and redis.call('EXISTS', dq.ck_index) == 1
  local turn = ew.mine
  if stay and (turn == nil or served > 0) then
    -- a new place at the back; none when the line is full (see above)
    turn = nil
    if ew.live < EW_MARKS_MAX then turn = ew_write('HINCRBY', ew.key, '#', 1) end
  end
  if stay and turn then
    local now = ew_time(ew)
    local till = now + ew.life
    if ew_write('HSET', ew.key, dq.qm, string.format('%d:%d', turn, till)) then
      ew_write('PEXPIRE', ew.key, math.max(till, ew.last) - now)
    end
  elseif ew.mine ~= nil then
    if ew.live <= 1 then redis.call('DEL', ew.key) else redis.call('HDEL', ew.key, dq.qm) end
  end
  if ew.room > served and #ew.behind > 0 then ew_wake(ew, ew.behind, ew.room - served) end
end
