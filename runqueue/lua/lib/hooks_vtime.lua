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
--@include sched
local function hooks_open(keys, args, own_keys, own_args, now)
  return sched_hooks(sched_open(keys[own_keys + 1], keys[own_keys + 2], keys[own_keys + 3],
                                args[own_args + 1], args[own_args + 2], now), args[own_args + 3] == '1')
end
