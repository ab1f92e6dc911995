-- dequeue (scheduler flag off): serve up to maxCount ready runs of one base
-- queue in age order (lowest ready score first across its variants; ties by
-- variant member), each moved in flight with a lease. One variant may give
-- several runs in one call. Variant keys are derived from their members in
-- the queue's hash slot (see lib/dequeue).
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
-- KEYS[10] -> shard delivery token counter STRING
-- ARGV[1] -> now (ms)
-- ARGV[2] -> maxCount (at most 2000)
-- ARGV[3] -> env concurrency limit, 0 for none
-- ARGV[4] -> queue concurrency limit (all keys), 0 for none
-- ARGV[5] -> per-key concurrency limit, 0 for none
-- ARGV[6] -> lease deadline (ms)
-- ARGV[7] -> queue member
-- ARGV[8] -> run member prefix (encoded env ":" encoded queue ":")
-- ARGV[9] -> priority step (ms)
-- ARGV[10] -> scan: ckIndex entries read (and due delayed variants promoted)
-- ARGV[11] -> promote limit: runs promoted per variant per call
-- ARGV[12] -> variant key base (the queue's keys' start .. ":v:")
-- Returns: see dq_finish.
--@include meta
--@include hooks
--@include place
--@include dequeue
--@include window
local OWN_KEYS, OWN_ARGS = 10, 12
local dq = dq_open(KEYS, ARGV)
if dq.cap <= 0 then return {} end
local hooks = hooks_open(KEYS, ARGV, OWN_KEYS, OWN_ARGS, dq.now)
dq_promote(dq, hooks)

-- Age order: the first scan entries of ckIndex (lowest head ready score,
-- then member); each serve takes the first servable one.
-- Without a per-key limit every variant in ckIndex is servable and each
-- serve moves one variant back, so the call can only serve among the first
-- cap: reading further (a costly WITHSCORES reply) would change nothing.
local reach = dq.scan
if dq.key_limit <= 0 then reach = math.min(dq.scan, dq.cap) end
local age = window_new(redis.call('ZRANGE', dq.ck_index, 0, reach, 'WITHSCORES'), reach)
local function servable(vm)
  return not dq_at_limit(dq, vm) and dq_head(dq, vm) ~= nil
end
while #dq.served < dq.cap do
  local vm = window_first(age, servable)
  if vm == nil then break end
  local nxt = dq_take(dq, vm)
  if nxt == nil then
    window_remove(age, vm)
  else
    window_move(age, vm, nxt)
  end
end
hooks.finish()
return dq_finish(dq)
