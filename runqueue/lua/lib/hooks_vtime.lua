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
--
-- The scheduler's code is defined inside lib(), at the first hook that
-- does something: Redis runs a script's whole body at every call, and most
-- calls of these scripts (an enqueue behind a variant's head, an ack
-- without a key limit) need none of it, so they do not pay for making its
-- closures and tables.
local function hooks_open(keys, args, own_keys, own_args, now)
  local look = args[own_args + 3] == '1'
  local h -- the scheduler's hooks, once lib() has run
  local function lib()
    if h == nil then
      h = (function()
        --@include sched
        local S = sched_open(keys[own_keys + 1], keys[own_keys + 2], keys[own_keys + 3],
                             args[own_args + 1], args[own_args + 2], now)
        S.check = true -- look for the sentinel (see sched_state)
        return sched_hooks(S, look)
      end)()
    end
    return h
  end
  return {
    ready_start = function(vm) lib().ready_start(vm) end,
    ready_empty = function(vm) lib().ready_empty(vm) end,
    released = function(vms) if look then lib().released(vms) end end,
    finish = function() if h then h.finish() end end,
  }
end
