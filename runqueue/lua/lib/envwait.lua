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

--@include envline

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
