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
-- does something (only its registration part when that hook is
-- ready_start): Redis runs a script's whole body at every call, and most
-- calls of these scripts (an enqueue behind a variant's head, an ack
-- without a key limit) need none of it, so they do not pay for making its
-- closures and tables, and an enqueue of a key's first run pays for half.
local function hooks_open(keys, args, own_keys, own_args, now)
  local look = args[own_args + 3] == '1'
  -- The scheduler's state (sched_open), made by the first hook that does
  -- something, and shared by both definitions below.
  local S
  local function open(sched_open)
    if S == nil then
      S = sched_open(keys[own_keys + 1], keys[own_keys + 2], keys[own_keys + 3],
                     args[own_args + 1], args[own_args + 2], now)
      S.check = true -- look for the sentinel (see sched_state)
    end
    return S
  end
  -- reg: registration alone (lib/sched_reg), for the many calls whose only
  -- hook that runs is ready_start (an enqueue of a key's first run);
  -- h: the whole scheduler's hooks. Both act on S: a call that needs h
  -- after reg goes on with the same state, and writes it once.
  local reg, h
  local function lib()
    if h == nil then
      h = (function()
        --@include sched
        return sched_hooks(open(sched_open), look)
      end)()
    end
    return h
  end
  local function register(vm)
    if h then return h.ready_start(vm) end
    if reg == nil then
      reg = (function()
        --@include sched_reg
        open(sched_open)
        return { ready_start = function(v) sched_register(S, v, false) end,
                 finish = function() sched_save(S) end }
      end)()
    end
    reg.ready_start(vm)
  end
  return {
    ready_start = register,
    ready_empty = function(vm) lib().ready_empty(vm) end,
    released = function(vms) if look then lib().released(vms) end end,
    finish = function()
      if h then h.finish() elseif reg then reg.finish() end
    end,
  }
end
