-- enqueue: store runs of one base queue and queue each in its variant
-- (ready or delayed). Each run is all or nothing; a run whose id exists is
-- a no-op when its variant and payload are the same (an idempotent retry)
-- and a conflict otherwise.
--
-- KEYS[1] -> queue runs HASH (encoded id -> record, see lib/record)
-- KEYS[2] -> queue ckIndex ZSET (variant member, score head ready score ms)
-- KEYS[3] -> queue delayIndex ZSET (variant member, score earliest available_at ms)
-- KEYS[4] -> queue depth HASH (r: ready count, d: delayed count)
-- KEYS[5] -> shard master ZSET (queue member, score earliest work ms)
-- KEYS[6] -> shard ttl ZSET (run member, score expiry deadline ms)
-- ARGV[1] -> now (ms)
-- ARGV[2] -> variant key base (keys.Queue.VariantBase)
-- ARGV[3] -> queue member (for the master ZSET)
-- ARGV[4] -> wake channel ("" to not publish)
-- ARGV[5] -> maximum queued runs in the queue, 0 for no limit
-- ARGV[6] -> maximum queued runs in a variant, 0 for no limit
-- ARGV[7] -> run member prefix (encoded env ":" encoded queue ":")
-- ARGV[8] -> n, the number of runs (at most 1000)
-- ARGV[9+7i..15+7i] -> run i: encoded id, variant member, record, payload
--                      offset in the record, available_at (ms), ready score
--                      (ms), expiry deadline (ms, 0 for none)
-- Flag on: KEYS[7..9] and ARGV[9+7n..11+7n] follow, the scheduler's (see
-- lib/hooks_vtime).
-- Returns: one value per run: 1 queued, 0 already queued with the same
-- variant and payload (no-op), "conflict" (same id, other body),
-- "queue_full" or "key_full" (admission refused; nothing written).
--@include record
--@include hooks
--@include place
local q = { runs = KEYS[1], ck_index = KEYS[2], delay_index = KEYS[3], depth = KEYS[4],
            master = KEYS[5], qm = ARGV[3] }
local ttl_set = KEYS[6]
local now = ARGV[1] + 0 -- (client-written integers: see num in lib/record)
local vbase, wake, prefix = ARGV[2], ARGV[4], ARGV[7]
local max_queue, max_key, n = ARGV[5] + 0, ARGV[6] + 0, ARGV[8] + 0
local OWN_KEYS, OWN_ARGS = 6, 8 + 7 * n
local hooks = hooks_open(KEYS, ARGV, OWN_KEYS, OWN_ARGS, now)

-- Whether a run of variant v may be queued now (admission control); nil
-- without a limit. (A script makes a closure of every function it defines
-- at every call, some 1,100 instructions each on Redis 7.0: the functions
-- only some calls need are made only for those.)
local admitted = nil
if max_queue > 0 or max_key > 0 then
  admitted = function(v)
    if max_queue > 0 then
      local d = redis.call('HMGET', q.depth, 'r', 'd')
      if (tonumber(d[1]) or 0) + (tonumber(d[2]) or 0) >= max_queue then return 'queue_full' end
    end
    if max_key > 0 and redis.call('ZCARD', v.ready) + redis.call('ZCARD', v.delayed) >= max_key then
      return 'key_full'
    end
    return nil
  end
end

-- The answer to run i (argument base b) when its id is stored already,
-- with record old: 0 when it is the same run (same variant and payload:
-- an idempotent retry), else 'conflict'.
local function stored_answer(old, b)
  local r = rec_parse(old)
  if r.vm == ARGV[b + 1] and string.sub(old, r.pos) == string.sub(ARGV[b + 2], tonumber(ARGV[b + 3])) then
    return 0
  end
  return 'conflict'
end

-- One run at a time (few runs, or admission limits that each run reads):
-- each run's commands in turn.
local function enqueue_each()
  local out, woke = {}, false
  -- Several runs: index entries that cannot move are not written again,
  -- and the depth counts are written once at the end, unless admission
  -- reads them.
  if n > 1 then q.memo = place_memo(q, max_queue == 0) end
  for i = 0, n - 1 do
    local b = 9 + 7 * i
    local id, vm, rec, at, rs, expires = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 4], ARGV[b + 5], ARGV[b + 6]
    local v = variant_keys(vbase, vm)
    if redis.call('HSETNX', q.runs, id, rec) == 0 then
      out[i + 1] = stored_answer(redis.call('HGET', q.runs, id), b)
    else
      local refused = admitted and admitted(v)
      if refused then
        redis.call('HDEL', q.runs, id)
        out[i + 1] = refused
      else
        if expires ~= '0' then redis.call('ZADD', ttl_set, expires, prefix .. vm .. ':' .. id) end
        if place(q, v, hooks, id, vm, at, rs, now) then woke = true end
        out[i + 1] = 1
      end
    end
  end
  place_flush(q)
  return out, woke
end

-- In bulk from BULK_AT runs (with no admission limit): below it a command
-- per run costs Redis less than sorting the runs into their sets (measured
-- on Redis 7.0 with every run of another key: the bulk path costs 10%
-- more at 10 runs, the same at 100, 20% less at 1,000; with runs of a few
-- keys it costs 5% to 40% less from 10 runs on).
local BULK_AT = 32
local out, woke
if n >= BULK_AT and max_queue == 0 and max_key == 0 then
  -- (made only for a call that writes in bulk: see admitted)
  -- Move the entries of index (ckIndex or delayIndex) as the new runs one
  -- at a time would: run k of variant vms[k] scores ss[k] (in run order),
  -- with place's memo (q.memo) sparing the ZADD LT CH an earlier run of the
  -- variant makes a no-op. Returns the variant of each move in order (a
  -- variant again when it moves again: the scheduler hears of each move, as
  -- run by run, since a hook may start its state again in between) and the
  -- lowest score moved to (as given), or nil when none moved.
  local function index_moves(index, vms, ss)
    local moves, head, head_s, head_n = {}, nil, nil, 0
    for k, vm in ipairs(vms) do
      if place_moves(q, index, vm, ss[k]) and redis.call('ZADD', index, 'LT', 'CH', ss[k], vm) == 1 then
        moves[#moves + 1] = vm
        local s = ss[k] + 0
        if head == nil or s < head then head, head_s, head_n = s, ss[k], 1 elseif s == head then head_n = head_n + 1 end
      end
    end
    if #moves == 0 then return nil end
    return moves, head_s, head_n
  end

  -- Many runs and no admission limit: each kind of write in one command
  -- (a read of the ids, the records, each variant's set, the indexes), with
  -- the outcome of the runs queued one at a time: the same data, the same
  -- answers, and the scheduler told of the same variants in the same order.
  local function enqueue_batch()
    local ids = {}
    for i = 0, n - 1 do ids[i + 1] = ARGV[9 + 7 * i] end
    local stored = redis.call('HMGET', q.runs, unpack(ids))
    local out, first = {}, {} -- first: id -> argument base of the run that queued it
    local recs, ttls, sets, vkeys = {}, {}, {}, {}
    local order = { r = {}, d = {} } -- the ready and the delayed sets, as first written
    local rvm, rss, dvm, dss = {}, {}, {}, {} -- new ready and delayed runs: variant, score
    for i = 0, n - 1 do
      local b = 9 + 7 * i
      local id = ids[i + 1]
      if stored[i + 1] then
        out[i + 1] = stored_answer(stored[i + 1], b)
      elseif first[id] then
        out[i + 1] = stored_answer(ARGV[first[id] + 2], b)
      else
        first[id] = b
        out[i + 1] = 1
        local vm, at, expires = ARGV[b + 1], ARGV[b + 4], ARGV[b + 6]
        recs[#recs + 1] = id
        recs[#recs + 1] = ARGV[b + 2]
        if expires ~= '0' then
          ttls[#ttls + 1] = expires
          ttls[#ttls + 1] = prefix .. vm .. ':' .. id
        end
        local v = vkeys[vm]
        if v == nil then
          v = variant_keys(vbase, vm)
          vkeys[vm] = v
        end
        local set, score, kind
        if at + 0 <= now then
          set, score, kind = v.ready, ARGV[b + 5], 'r'
          rvm[#rvm + 1], rss[#rss + 1] = vm, score
        else
          set, score, kind = v.delayed, at, 'd'
          dvm[#dvm + 1], dss[#dss + 1] = vm, score
        end
        local z = sets[set]
        if z == nil then
          sets[set] = { score, id }
          local o = order[kind]
          o[#o + 1] = set
        else
          z[#z + 1] = score
          z[#z + 1] = id
        end
      end
    end
    if #recs == 0 then return out, false end
    redis.call('HSET', q.runs, unpack(recs))
    if #ttls > 0 then redis.call('ZADD', ttl_set, unpack(ttls)) end
    for _, o in ipairs({ order.r, order.d }) do
      for _, set in ipairs(o) do redis.call('ZADD', set, unpack(sets[set])) end
    end
    -- A counting memo of what was placed, for place_flush: the counts, the
    -- sets of each kind in order, their ZADD arguments (two a run: see
    -- place_memo), the last run's sets.
    local memo = place_memo(q, true)
    memo.r, memo.d, memo.sets, memo.args = #rvm, #dvm, order, sets
    if #rvm > 0 then memo.last.r = vkeys[rvm[#rvm]].ready end
    if #dvm > 0 then memo.last.d = vkeys[dvm[#dvm]].delayed end
    q.memo = memo
    local woke = false
    local moved, head = index_moves(q.ck_index, rvm, rss)
    if moved then
      for _, vm in ipairs(moved) do hooks:ready_start(vm) end -- (see index_moves)
      redis.call('ZADD', q.master, 'LT', head, q.qm)
      woke = true
    end
    local head_n
    moved, head, head_n = index_moves(q.delay_index, dvm, dss)
    if moved and (redis.call('ZADD', q.master, 'LT', 'CH', head, q.qm) == 1 or not woke and place_soonest(q, head, now, head_n)) then
      woke = true
    end
    place_flush(q) -- (after the indexes' moves: it may widen them)
    return out, woke
  end
  out, woke = enqueue_batch()
else
  out, woke = enqueue_each()
end
if woke and wake ~= '' then redis.call('PUBLISH', wake, q.qm) end
hooks:finish()
return out
