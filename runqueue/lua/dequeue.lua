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
-- Runs past their TTL are swept where the call meets them at the head of
-- their variant (lib/dequeue's dq_head_due): not served, not counted for
-- the capacity. dq_due looks whether the shard has any.
dq_due(dq)
dq_promote(dq, hooks)

-- Age order: the first scan entries of ckIndex (lowest head ready score,
-- then member); each serve takes the first servable one.
-- Without a per-key limit every variant in ckIndex is servable and each
-- serve moves one variant back, so the call can only serve among the first
-- cap (and the runs it may sweep): reading further (a costly WITHSCORES
-- reply) would change nothing.
local reach = dq.scan
if dq.key_limit <= 0 then reach = math.min(dq.scan, dq.cap + dq.sweep_room) end
local age = window_new(redis.call('ZRANGE', dq.ck_index, '0', num_arg(reach), 'WITHSCORES'), reach)
-- A variant ckIndex names whose ready set is empty before the call takes
-- anything from it (its runs taken out by hand, the set evicted) is stale:
-- it leaves ckIndex. Left there, at the head of age order, such entries
-- held every call of maxCount at most their number, for ever, serving
-- nothing. (A variant this call empties leaves the window as it does.)
local stale, is_stale = {}, {}
local function servable(vm)
  if dq_at_limit(dq, vm) then return false end
  if dq_head(dq, vm) ~= nil then return true end
  if not is_stale[vm] then
    is_stale[vm] = true
    stale[#stale + 1] = vm
  end
  return false
end
while #dq.served - dq.nswept < dq.cap do
  local vm = window_first(age, servable)
  if vm == nil then break end
  local nxt = dq_take(dq, vm, dq_head_due(dq, vm))
  if nxt == nil then
    window_remove(age, vm)
  else
    window_move(age, vm, nxt)
  end
end
if #stale > 0 then
  for _, vm in ipairs(stale) do window_remove(age, vm) end
  for i = 1, #stale, 1000 do
    redis.call('ZREM', dq.ck_index, unpack(stale, i, math.min(i + 999, #stale)))
  end
  dq.dirty = true
end
dq.ck_head = window_low(age) -- ckIndex's new head: no read for the master score
return dq_finish(dq, acked)
