-- Scheduler flag off: no scheduler state; the hooks do nothing. (The
-- flag-on build includes hooks_vtime instead, with the same function.)
local function hooks_open(keys, args, own_keys, own_args, now)
  local nop = function() end
  return { ready_start = nop, ready_empty = nop, released = nop, finish = nop }
end
