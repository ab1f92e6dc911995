-- dequeue (scheduler flag off): ack the runs the call carries, then serve
-- up to maxCount ready runs of one base queue in age order (lowest ready
-- score first across its variants; ties by variant member), each moved in
-- flight with a lease. One variant may give several runs in one call.
--
-- KEYS[1..11], ARGV[1..13+3a] -> see lib/dequeue
-- Returns: see dq_finish.
--@include record
--@include held
--@include hooks
--@include place
--@include dequeue
--@include window
local OWN_KEYS = 11
local dq = dq_open(KEYS, ARGV)
local hooks = hooks_open(KEYS, ARGV, OWN_KEYS, dq.own_args, dq.now)
local acked = dq_ack(dq, hooks)
if dq_capacity(dq) <= 0 then return dq_finish(dq, acked) end
dq_promote(dq, hooks)

-- Age order: the first scan entries of ckIndex (lowest head ready score,
-- then member); each serve takes the first servable one.
-- Without a per-key limit every variant in ckIndex is servable and each
-- serve moves one variant back, so the call can only serve among the first
-- cap: reading further (a costly WITHSCORES reply) would change nothing.
local reach = dq.scan
if dq.key_limit <= 0 then reach = math.min(dq.scan, dq.cap) end
local age = window_new(redis.call('ZRANGE', dq.ck_index, '0', num_arg(reach), 'WITHSCORES'), reach)
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
dq.ck_head = window_low(age) -- ckIndex's new head: no read for the master score
return dq_finish(dq, acked)
