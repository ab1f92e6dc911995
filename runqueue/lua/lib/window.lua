-- A window is the part of a sorted set a dequeue read: its first n entries
-- ({vm, s} in ZSET order: score, then member), kept sorted in memory as
-- scores change. An entry whose new score sorts after the n-th entry read
-- leaves the window, because unread entries may sort before it; a set read
-- whole (raw holds at most n entries) has no such bound. raw is a ZRANGE
-- WITHSCORES reply of up to n + spare + 1 entries; extra holds more {vm, s}
-- entries to merge in (variants registered by this call). Up to spare
-- entries after the first n are kept aside to refill the window when one
-- of its entries turns out to be stale (window_drop).
local function entry_before(a, b) return a.s < b.s or (a.s == b.s and a.vm < b.vm) end

local function window_new(raw, n, extra, spare)
  local list = {}
  for i = 1, #raw, 2 do list[#list + 1] = { vm = raw[i], s = tonumber(raw[i + 1]) } end
  if extra then
    for _, e in ipairs(extra) do list[#list + 1] = { vm = e.vm, s = e.s } end
    table.sort(list, entry_before)
  end
  local w = { list = list, bound = nil, spare = {} }
  if #list > n then
    spare = spare or 0
    for i = n + 1, math.min(#list, n + spare) do w.spare[#w.spare + 1] = list[i] end
    w.more = #list > n + spare
    for i = #list, n + 1, -1 do list[i] = nil end
    w.bound = { vm = list[n].vm, s = list[n].s }
  end
  return w
end

-- First member of the window for which ok(vm) holds, or nil.
local function window_first(w, ok)
  local list = w.list
  for i = 1, #list do
    local vm = list[i].vm
    if ok(vm) then return vm end
  end
  return nil
end

-- Remove vm; returns its entry, or nil when it was not in the window.
local function window_remove(w, vm)
  local list = w.list
  for i = 1, #list do
    local e = list[i]
    if e.vm == vm then
      table.remove(list, i)
      return e
    end
  end
  return nil
end

-- Drop vm from the window for good and take the next spare entry in its
-- place (every spare entry sorts after the window's, so it goes last).
local function window_drop(w, vm)
  if not window_remove(w, vm) then return end
  local nxt = table.remove(w.spare, 1)
  if nxt == nil then return end
  w.list[#w.list + 1] = nxt
  if #w.spare == 0 and not w.more then
    w.bound = nil
  else
    w.bound = { vm = nxt.vm, s = nxt.s }
  end
end

-- Re-sort vm with its new score s, if it is in the window.
local function window_move(w, vm, s)
  local e = window_remove(w, vm)
  if e == nil then return end
  e.s = s
  if w.bound ~= nil and entry_before(w.bound, e) then return end
  local list = w.list
  local at = #list + 1
  for i = 1, #list do
    if entry_before(e, list[i]) then
      at = i
      break
    end
  end
  table.insert(list, at, e)
end
