-- Scheduler flag off: variants are served in age order; nothing to track.
local function on_ready_start(vm) end
local function on_ready_empty(vm) end
