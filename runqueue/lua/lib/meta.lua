-- Run metadata lives in one HASH field per run: "st|att|dl|ld|vm|pr|at|ttl".
--   st  state: r ready, d delayed, f in flight, x dead
--   att attempt number of the next (or current) delivery, from 1
--   dl  delivery counter: the lease token of the current holder
--   ld  lease deadline (ms), 0 when not in flight
--   vm  variant member ("=" + encoded concurrency key)
--   pr  priority 0..9
--   at  available_at (ms)
--   ttl expiry deadline (ms), 0 for none
local function meta_parse(s)
  local st, att, dl, ld, vm, pr, at, ttl =
    string.match(s, '^(%a)|(%d+)|(%d+)|(%d+)|([^|]*)|(%d)|(-?%d+)|(%d+)$')
  return { st = st, att = tonumber(att), dl = tonumber(dl), ld = tonumber(ld), vm = vm,
           pr = tonumber(pr), at = tonumber(at), ttl = tonumber(ttl) }
end

local function meta_format(m)
  return m.st .. '|' .. string.format('%d', m.att) .. '|' .. string.format('%d', m.dl) .. '|' ..
    string.format('%d', m.ld) .. '|' .. m.vm .. '|' .. string.format('%d', m.pr) .. '|' ..
    string.format('%d', m.at) .. '|' .. string.format('%d', m.ttl)
end

-- A number Redis returned as a string (a score). Real Redis prints scores
-- so that tonumber reads them; miniredis prints some as "1e+8", which
-- gopher-lua's tonumber refuses.
local function num(s)
  local n = tonumber(s)
  if n == nil and s then
    n = tonumber((string.gsub(string.gsub(s, 'e%+', 'e'), '^(-?%d+)e', '%1.0e')))
  end
  return n
end
