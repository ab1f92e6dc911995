-- Shared end of the dequeue scripts: persist the serves chosen in memory,
-- move the runs in flight with a lease, and return them.
-- Returns a flat array: for each run, encoded id, variant member, payload,
-- attempt, delivery token.
if #served == 0 then
  if dirty then master_refresh(q.ck_index, q.delay_index, q.master, q.qm) end
  return {}
end
-- head() read past the last run taken (or found the set ended), so the
-- new head of each touched variant is known without reading it again.
local heads, emptied = {}, {}
for _, vm in ipairs(touched) do
  local c = cands[vm]
  local ids = {}
  for i = 1, c.taken do ids[i] = c.list[2 * i - 1] end
  redis.call('ZREMRANGEBYRANK', c.ready, 0, c.taken - 1)
  redis.call('SADD', c.inflight, unpack(ids))
  local p = 2 * c.taken + 1
  if c.list[p] then
    heads[#heads + 1] = c.list[p + 1]
    heads[#heads + 1] = vm
  else
    emptied[#emptied + 1] = vm
  end
end
if #heads > 0 then redis.call('ZADD', q.ck_index, unpack(heads)) end
if #emptied > 0 then redis.call('ZREM', q.ck_index, unpack(emptied)) end
depth_sub(q.depth, 'r', #served)

local ids, fields, members, lease_args = {}, {}, {}, {}
for i, s in ipairs(served) do
  ids[i] = s.id
  fields[2 * i - 1] = s.id
  fields[2 * i] = s.id .. ':p'
  members[i] = run_prefix .. s.vm .. ':' .. s.id
  lease_args[2 * i - 1] = lease_deadline
  lease_args[2 * i] = members[i]
end
-- Metadata and payload of every served run in one read.
local got = redis.call('HMGET', q.meta, unpack(fields))
local hargs, out, expiring = {}, {}, {}
for i, s in ipairs(served) do
  local m = meta_parse(got[2 * i - 1])
  m.st, m.dl, m.ld = 'f', m.dl + 1, lease_deadline
  if m.ttl > 0 then expiring[#expiring + 1] = members[i] end
  hargs[#hargs + 1] = s.id
  hargs[#hargs + 1] = meta_format(m)
  out[#out + 1] = s.id
  out[#out + 1] = s.vm
  out[#out + 1] = got[2 * i]
  out[#out + 1] = m.att
  out[#out + 1] = m.dl
end
redis.call('HSET', q.meta, unpack(hargs))
redis.call('SADD', env_inflight, unpack(members))
redis.call('SADD', queue_inflight, unpack(ids))
redis.call('ZADD', leases, unpack(lease_args))
if #expiring > 0 then redis.call('ZREM', ttl_set, unpack(expiring)) end
master_refresh(q.ck_index, q.delay_index, q.master, q.qm)
