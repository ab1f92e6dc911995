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
      --@include sched
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
      --@include envline
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
