-- dequeue (scheduler flag off): serve up to maxCount ready runs of one base
-- queue in age order (lowest ready score first across its variants; ties by
-- variant member), each moved in flight with a lease. One variant may give
-- several runs in one call.
--
-- KEYS[1] -> queue ckIndex ZSET (variant member, score head ready score ms)
-- KEYS[2] -> queue delayIndex ZSET (variant member, score earliest available_at ms)
-- KEYS[3] -> queue depth HASH (r, d)
-- KEYS[4] -> shard master ZSET (queue member, score earliest work ms)
-- KEYS[5] -> shard leases ZSET (run member, score lease deadline ms)
-- KEYS[6] -> env inflight SET (run members)
-- KEYS[7] -> queue inflight SET (encoded ids)
-- KEYS[8] -> queue meta HASH
-- KEYS[9] -> queue payload HASH
-- KEYS[10] -> shard ttl ZSET (run member, score expiry deadline ms)
-- KEYS[11+3i..13+3i] -> candidate i's ready ZSET, delayed ZSET, inflight SET
-- ARGV[1] -> now (ms)
-- ARGV[2] -> maxCount
-- ARGV[3] -> env concurrency limit, 0 for none
-- ARGV[4] -> queue concurrency limit (all keys), 0 for none
-- ARGV[5] -> per-key concurrency limit, 0 for none
-- ARGV[6] -> lease deadline (ms)
-- ARGV[7] -> queue member
-- ARGV[8] -> run member prefix (encoded env ":" encoded queue ":")
-- ARGV[9] -> priority step (ms)
-- ARGV[10] -> scan: ckIndex entries read (and due delayed variants promoted)
-- ARGV[11] -> promote limit: runs promoted per variant per call
-- ARGV[12] -> n, the number of candidate variants
-- ARGV[13..12+n] -> candidate variant members, in KEYS order
-- Returns: see dequeue_end.
local FK = 10
--@include meta
--@include hooks
--@include place
--@include dequeue_begin

-- Age order: entries of ckIndex read once, kept sorted in memory. An entry
-- whose new head sorts after the last entry read leaves the list, because
-- unread variants may sort before it.
local order = redis.call('ZRANGE', q.ck_index, 0, scan - 1, 'WITHSCORES')
local list = {}
for i = 1, #order, 2 do list[#list + 1] = { vm = order[i], rs = tonumber(order[i + 1]) } end
local bound = nil
if #list == scan then bound = { vm = list[#list].vm, rs = list[#list].rs } end
local function before(a, b) return a.rs < b.rs or (a.rs == b.rs and a.vm < b.vm) end

while #served < cap do
  local pick = nil
  for i, e in ipairs(list) do
    if cands[e.vm] ~= nil and not key_gated(e.vm) and head(e.vm) ~= nil then
      pick = i
      break
    end
  end
  if pick == nil then break end
  local e = table.remove(list, pick)
  local _, nxt = take(e.vm)
  if nxt ~= nil then
    e.rs = nxt
    if bound == nil or not before(bound, e) then
      local at = #list + 1
      for i, o in ipairs(list) do
        if before(e, o) then at = i break end
      end
      table.insert(list, at, e)
    end
  end
end
--@include dequeue_end
return out
