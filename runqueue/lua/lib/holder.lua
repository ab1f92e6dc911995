-- Load run id of variant vm and check that it is in flight under the lease
-- token the caller holds (token 0: any holder whose lease has passed now).
-- Returns the parsed metadata, or nil and an error reply.
local function load_held(meta, id, vm, token, now)
  local raw = redis.call('HGET', meta, id)
  if not raw then return nil, redis.error_reply('RQ_NOT_FOUND no such run') end
  local m = meta_parse(raw)
  if m.vm ~= vm then return nil, redis.error_reply('RQ_NOT_FOUND no such run under this concurrency key') end
  if m.st ~= 'f' then return nil, redis.error_reply('RQ_NOT_IN_FLIGHT run is not in flight') end
  if token > 0 then
    if m.dl ~= token then return nil, redis.error_reply('RQ_LEASE_LOST lease is held by a later delivery') end
  elseif m.ld > now then
    return nil, redis.error_reply('RQ_LEASE_ACTIVE lease has not expired')
  end
  return m
end
