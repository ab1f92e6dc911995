-- The queues waiting for a slot of their env (layout 8; flag-on dequeues
-- only). An env's limit is shared by its queues, and a dequeue serves one
-- queue: without this, a consumer that acks and takes in one call takes
-- back every slot its acks free, and another queue of the env at its limit
-- waits until that queue's backlog drains.
--
-- The env's waiting HASH holds a field per waiting queue: its member ->
-- "<turn>:<until>": its place in the line and, in ms, live until; and the
-- field "#", the last place given (a queue member always holds a ':').
-- A dequeue whose call the env's limit held to less than it could take
-- otherwise (the queue's limit and maxCount), and that leaves ready runs
-- behind, marks its queue: the place is kept while the queue waits without
-- being served, and a new one (the back of the line) is taken when it was
-- served or had none. A dequeue that the env does not hold so, or that
-- leaves nothing ready, drops its mark (and the hash with its last one).
-- A mark past its until is dead (its consumer gone or gone quiet) and
-- dropped by the next call that reads it; a waiter renews it at each call
-- (until: now + the caller's mark life, twice its poll interval and a
-- second).
--
-- Every dequeue of the env's queues leaves a free slot to each live mark
-- of another queue ahead of its own in the line (to every one when it has
-- none) and publishes a wake-up to the first of them (up to
-- EW_WAKE_MAX), so each slot an ack frees goes to the queue that waited
-- longest. An env without a limit reads nothing: the dequeue is sent
-- without the hash's key (and opens no line) then.

local EW_WAKE_MAX = 16

local function ew_open(key, wake, life, dq)
  return { key = key, wake = wake, life = life + 0, dq = dq, mine = nil, room = 0, held = false, lazy = false }
end

-- After dq_capacity: dq.cap less the env's free slots left to the queues
-- that wait longer. An ack-only call (maxCount 0) wakes them and changes
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
  local free = dq.env_limit - (tonumber(redis.call('GET', dq.env_n)) or 0)
  local ahead, dead, live = {}, {}, 0
  for i = 1, #raw, 2 do
    if raw[i] ~= '#' then
      local turn, till = string.match(raw[i + 1], '^(%-?%d+):(%-?%d+)$')
      if turn == nil or till + 0 < dq.now then
        dead[#dead + 1] = raw[i]
      elseif raw[i] == dq.qm then
        ew.mine, live = turn + 0, live + 1
      else
        ahead[#ahead + 1] = { raw[i], turn + 0 }
        live = live + 1
      end
    end
  end
  if #dead > 0 then
    if live == 0 then redis.call('DEL', ew.key) else redis.call('HDEL', ew.key, unpack(dead)) end
  end
  if ew.mine ~= nil then
    local older = {}
    for _, o in ipairs(ahead) do
      if o[2] < ew.mine then older[#older + 1] = o end
    end
    ahead = older
  end
  if #ahead > 0 and free > 0 then
    table.sort(ahead, function(a, b) return a[2] < b[2] end)
    for i = 1, math.min(#ahead, free, EW_WAKE_MAX) do redis.call('PUBLISH', ew.wake, ahead[i][1]) end
  end
  if dq.max_count <= 0 then return end
  ew.room = free - #ahead
  -- What the call could take but for the env: maxCount within the
  -- queue's limit.
  local other = dq.max_count
  if dq.queue_limit > 0 then other = math.min(other, dq.queue_limit - held_count(dq.held)) end
  ew.held = ew.room < other
  if ew.room < dq.cap then dq.cap = math.max(ew.room, 0) end
end

-- After the serves (served: how many the call took): the call's mark.
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
  if ew.held and served >= ew.room and redis.call('EXISTS', dq.ck_index) == 1 then
    local turn = ew.mine
    if turn == nil or served > 0 then turn = redis.call('HINCRBY', ew.key, '#', 1) end
    redis.call('HSET', ew.key, dq.qm, string.format('%d:%d', turn, dq.now + ew.life))
    redis.call('PEXPIRE', ew.key, ew.life)
  elseif ew.mine ~= nil then
    redis.call('HDEL', ew.key, dq.qm)
    if redis.call('HLEN', ew.key) <= 1 then redis.call('DEL', ew.key) end
  end
end
