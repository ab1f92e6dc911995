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
-- KEYS[8] -> queue runs HASH (metadata and payload fields)
-- KEYS[9] -> shard ttl ZSET (run member, score expiry deadline ms)
-- KEYS[10+3i..12+3i] -> candidate i's ready ZSET, delayed ZSET, inflight SET
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
local FK = 9
local now = tonumber(ARGV[1])
--@include meta
--@include hooks
--@include place
--@include dequeue_begin
--@include window

-- Age order: the first scan entries of ckIndex (lowest head ready score,
-- then member); each serve takes the first servable one.
-- Without a per-key limit every variant in ckIndex is servable and each
-- serve moves one variant back, so the call can only serve among the first
-- cap: reading further (a costly WITHSCORES reply) would change nothing.
local reach = scan
if key_limit <= 0 then reach = math.min(scan, cap) end
local age = window_new(redis.call('ZRANGE', q.ck_index, 0, reach, 'WITHSCORES'), reach)
local function servable(vm)
  return cands[vm] ~= nil and not key_gated(vm) and head(vm) ~= nil
end
while #served < cap do
  local vm = window_first(age, servable)
  if vm == nil then break end
  local _, nxt = take(vm)
  if nxt == nil then
    window_remove(age, vm)
  else
    window_move(age, vm, nxt)
  end
end
--@include dequeue_end
return out
