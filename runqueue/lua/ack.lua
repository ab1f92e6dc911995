-- ack: runs of one base queue are done; each is removed everywhere and its
-- concurrency released. A run that no longer exists is done already (an
-- ack whose first call went through and was sent again finds it so).
--
-- KEYS[1] -> queue runs HASH (encoded id -> record)
-- KEYS[2] -> queue held HASH ("<variant member>:<encoded id>" -> delivery token)
-- KEYS[3] -> queue key-inflight HASH (variant member -> runs in flight)
-- KEYS[4] -> env in-flight counter STRING
-- KEYS[5] -> shard leases ZSET (run member, score lease deadline ms)
-- ARGV[1] -> now (ms)
-- ARGV[2] -> run member prefix (encoded env ":" encoded queue ":")
-- ARGV[3] -> n, the number of runs (at most 1000)
-- ARGV[4+3i..6+3i] -> run i: variant member, encoded id, delivery token
-- Flag on: KEYS[6..8] and ARGV[4+3n..6+3n] follow, the scheduler's (see
-- lib/hooks_vtime).
-- Returns: one value per run: 1 acked, 0 gone already, "not_found" (the
-- run exists under another key), "not_in_flight" or "lease_lost".
--@include record
--@include held
--@include hooks
local k = { runs = KEYS[1], held = KEYS[2], kin = KEYS[3], env_n = KEYS[4], leases = KEYS[5] }
local now, n = ARGV[1] + 0, ARGV[3] + 0 -- (see num in lib/record)
local OWN_KEYS, OWN_ARGS = 5, 3 + 3 * n
local hooks = hooks_open(KEYS, ARGV, OWN_KEYS, OWN_ARGS, now)
local out = held_ack(k, ARGV[2], ARGV, 4, n, now, hooks)
hooks:finish()
return out
