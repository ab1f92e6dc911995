-- A window is the part of a sorted set a dequeue read: its first n entries
-- ({vm, s} in ZSET order: score, then member), kept sorted in memory as
-- scores change. raw is a ZRANGE WITHSCORES reply of up to n + 1 entries;
-- when it holds n + 1, the last is the bound: the first entry left out,
-- which the call does not change, and every unread entry sorts after it.
-- An entry whose new score sorts after the bound leaves the window, since
-- unread entries may sort before it; a set read whole (raw holds at most n
-- entries) has no bound. Its entries are a span (lib/span).
--@include span

-- a < b comparing bytes, as a ZSET orders members (Lua's "<" on strings
-- follows the server's locale: LC_COLLATE).
local function bytes_less(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

local function entry_before(a, b) return a.s < b.s or (a.s == b.s and bytes_less(a.vm, b.vm)) end

local function window_new(raw, n)
  local list = {}
  for i = 1, #raw, 2 do list[#list + 1] = { vm = raw[i], s = num(raw[i + 1]) } end
  local w = { list = list, head = 1, tail = #list, bound = nil }
  if #list > n then
    w.bound = { vm = list[n + 1].vm, s = list[n + 1].s }
    for i = #list, n + 1, -1 do list[i] = nil end
    w.tail = n
  end
  return w
end

-- First member of the window for which ok(vm) holds, or nil.
local function window_first(w, ok)
  local list = w.list
  for i = w.head, w.tail do
    local vm = list[i].vm
    if ok(vm) then return vm end
  end
  return nil
end

-- Remove vm; returns its entry, or nil when it was not in the window.
local function window_remove(w, vm)
  local list = w.list
  for i = w.head, w.tail do
    if list[i].vm == vm then return span_remove(w, i) end
  end
  return nil
end

-- Re-sort vm with its new score s, if it is in the window.
local function window_move(w, vm, s)
  local e = window_remove(w, vm)
  if e == nil then return end
  e.s = s
  if w.bound ~= nil and entry_before(w.bound, e) then return end
  span_place(w, e, entry_before)
end

-- The lowest score of the set the window was read from, after the moves
-- and removals the window saw (the set changed through it alone): its
-- first entry, or the bound, a stored entry below every other unread one;
-- false when the set was read whole and is now empty. (The bound was once
-- the n-th entry as read: when the call served or emptied that variant,
-- the score was one no stored entry had, and the shard master kept the
-- queue earlier than its oldest work.)
local function window_low(w)
  local first = w.list[w.head]
  local s = first and first.s
  if w.bound ~= nil and (s == nil or w.bound.s < s) then s = w.bound.s end
  if s == nil then return false end
  return s
end
