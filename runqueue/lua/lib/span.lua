-- A span: a sorted list kept as s.list[s.head..s.tail], for the windows
-- both dequeues keep of the variants they read. A serve takes an entry
-- near the front and puts it back further on: dropping the front by
-- moving head on, and inserting by shifting the shorter side, costs a few
-- moves where table.remove and table.insert shift every later entry
-- through Lua's C API (some 100 instructions each).

-- Insert e at position lo (head <= lo <= tail + 1): the entries before lo
-- move one place back when the head has room and they are fewer, else
-- those from lo one place on.
local function span_insert(s, lo, e)
  local list = s.list
  if s.head > 1 and lo - s.head < s.tail + 1 - lo then
    for j = s.head, lo - 1 do list[j - 1] = list[j] end
    s.head = s.head - 1
    list[lo - 1] = e
  else
    for j = s.tail, lo, -1 do list[j + 1] = list[j] end
    s.tail = s.tail + 1
    list[lo] = e
  end
end

-- Insert e at its rank in the sorted span: before the first entry it sorts
-- before by less (a binary search: a call of n serves over n entries costs
-- n log n comparisons, not n^2). A served entry most often sorts last, so
-- the last entry is compared first.
local function span_place(s, e, less)
  local list = s.list
  local lo, hi = s.head, s.tail + 1
  if lo < hi and not less(e, list[hi - 1]) then lo = hi end
  while lo < hi do
    local mid = lo + hi
    mid = (mid - mid % 2) / 2 -- (floor without a call)
    if less(e, list[mid]) then hi = mid else lo = mid + 1 end
  end
  span_insert(s, lo, e)
end

-- Remove the entry at position i (head <= i <= tail) and return it: the
-- entries before it move one place on (none when i is the head).
local function span_remove(s, i)
  local list = s.list
  local e = list[i]
  for j = i, s.head + 1, -1 do list[j] = list[j - 1] end
  list[s.head] = nil
  s.head = s.head + 1
  return e
end
