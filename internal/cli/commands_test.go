package cli_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/cli"
	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// decode decodes a command's JSON into T, refusing fields T does not have.
func decode[T any](t testing.TB, s string) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&v), s)
	return v
}

func TestStats(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := demo(t, c)
		require.Equal(t, lines(
			"env           prod",
			"queue         builds",
			"ready         1",
			"delayed       1",
			"in flight     1",
			"dead          2",
			"oldest ready  AGE",
		), maskAges(b.run(t, "stats", "prod", "builds").ok(t)))
		require.Equal(t, lines(
			"env           prod",
			"ready         1",
			"delayed       1",
			"in flight     1",
			"dead          2",
			"oldest ready  AGE",
		), maskAges(b.run(t, "stats", "prod").ok(t)))
		require.Equal(t, lines(
			"env           prod",
			"queue         builds",
			"key           acme",
			"ready         1",
			"delayed       0",
			"in flight     1",
			"oldest ready  AGE",
		), maskAges(b.run(t, "stats", "prod", "builds", "acme").ok(t)))

		type statsJSON struct {
			Env              string  `json:"env"`
			Queue            *string `json:"queue"`
			Key              *string `json:"key"`
			Ready            int64   `json:"ready"`
			Delayed          int64   `json:"delayed"`
			InFlight         int64   `json:"in_flight"`
			Dead             *int64  `json:"dead"`
			OldestReadyAgeMS int64   `json:"oldest_ready_age_ms"`
		}
		ptr := func(s string) *string { return &s }
		two := int64(2)
		s := decode[statsJSON](t, b.run(t, "stats", "-json", "prod", "builds").ok(t))
		// The oldest ready run became ready at the writer's clock.
		require.Greater(t, s.OldestReadyAgeMS, time.Since(epoch).Milliseconds()-60_000)
		s.OldestReadyAgeMS = 0
		require.Equal(t, statsJSON{Env: "prod", Queue: ptr("builds"), Ready: 1, Delayed: 1, InFlight: 1, Dead: &two}, s)

		s = decode[statsJSON](t, b.run(t, "stats", "-json", "prod", "builds", "").ok(t))
		require.Equal(t, statsJSON{Env: "prod", Queue: ptr("builds"), Key: ptr("")}, s,
			"the runs without a key drained; dead runs are not counted per key")
	})
}

func TestSchedule(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := demo(t, c)
		require.Equal(t, lines(
			"env    prod",
			"queue  builds",
			"V      0.5",
			"keys   5",
			"",
			"KEY       STATUS              TAG  LAG  SEQ  WEIGHT  READY  DELAYED  IN FLIGHT  PARKED",
			"-         idle                -    -    -    1       0      0        0          1",
			"acme      at its limit        1    0.5  1    1       1      0        1          -",
			"globex    idle                -    -    -    2       0      0        0          1",
			"initech   head in the future  -    -    -    1       0      1        0          -",
			"umbrella  idle                -    -    -    1       0      0        0          1",
		), b.run(t, "schedule", "-key-limit", "1", "prod", "builds").ok(t))

		type keyJSON struct {
			Key        string   `json:"key"`
			Competing  bool     `json:"competing"`
			Reason     string   `json:"reason"`
			Registered bool     `json:"registered"`
			Tag        *float64 `json:"tag"`
			Lag        *float64 `json:"lag"`
			Seq        *int64   `json:"seq"`
			Gated      bool     `json:"gated"`
			Weight     float64  `json:"weight"`
			Parked     *float64 `json:"parked"`
			Ready      int64    `json:"ready"`
			Delayed    int64    `json:"delayed"`
			InFlight   int64    `json:"in_flight"`
		}
		type scheduleJSON struct {
			Env   string    `json:"env"`
			Queue string    `json:"queue"`
			V     float64   `json:"v"`
			Keys  []keyJSON `json:"keys"`
		}
		got := decode[scheduleJSON](t, b.run(t, "schedule", "-json", "-key-limit", "1", "prod", "builds").ok(t))

		// The same view as the library's, field by field.
		ro := readOnly(t, b, func(cfg *runqueue.Config) { cfg.KeyConcurrency = 1 })
		want, err := ro.Schedule(b.ctx, "prod", "builds", 1)
		require.NoError(t, err)
		require.Equal(t, want.V, got.V)
		require.Len(t, got.Keys, len(want.Keys))
		for i, w := range want.Keys {
			g := got.Keys[i]
			require.Equal(t, w.Key, g.Key)
			require.Equal(t, w.Reason, g.Reason)
			require.Equal(t, w.Reason == "", g.Competing)
			require.Equal(t, w.Registered, g.Registered)
			require.Equal(t, w.Registered, g.Tag != nil && g.Lag != nil && g.Seq != nil)
			if w.Registered {
				require.Equal(t, w.Tag, *g.Tag)
				require.Equal(t, w.Lag, *g.Lag)
				require.Equal(t, w.Seq, *g.Seq)
			}
			require.Equal(t, w.HasParked, g.Parked != nil)
			if w.HasParked {
				require.Equal(t, w.Parked, *g.Parked)
			}
			require.Equal(t, w.Gated, g.Gated)
			require.Equal(t, w.Weight, g.Weight)
			require.Equal(t, []int64{w.Ready, w.Delayed, w.InFlight}, []int64{g.Ready, g.Delayed, g.InFlight})
		}
		require.Equal(t, "acme", got.Keys[1].Key)
		require.True(t, got.Keys[1].Gated)

	})
}

// readOnly opens a read-only Queue on the bundle's deployment.
func readOnly(t testing.TB, b *bundle, mutate func(*runqueue.Config)) *runqueue.Queue {
	t.Helper()
	cfg := &runqueue.Config{Prefix: b.prefix, VtimeScheduling: b.vtime, ReadOnly: true}
	if mutate != nil {
		mutate(cfg)
	}
	q, err := runqueue.New(b.ctx, b.client, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// TestScheduleLimits: with the fair scheduler off no key is registered,
// which the table says; the deployment's limits decide the reasons.
func TestScheduleLimits(t *testing.T) {
	t.Parallel()
	b := setup(t, redistest.Mini(t), false, nil)
	for _, id := range []string{"1", "2"} {
		_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", Key: "k", ID: id})
		require.NoError(t, err)
	}
	_, err := b.q.Dequeue(b.ctx, "e", "q", 1)
	require.NoError(t, err)
	require.Equal(t, lines(
		"env    e",
		"queue  q",
		"V      0",
		"keys   1",
		"note: -vtime is off: such a deployment serves keys in age order and keeps no tags",
		"",
		"KEY  STATUS              TAG  LAG  SEQ  WEIGHT  READY  DELAYED  IN FLIGHT  PARKED",
		"k    awaiting discovery  -    -    -    1       1      0        1          -",
	), b.run(t, "schedule", "e", "q").ok(t))
	for flag, reason := range map[string]string{
		"-env-limit":   "queue or env at its limit",
		"-queue-limit": "queue or env at its limit",
		"-key-limit":   "at its limit",
	} {
		require.Contains(t, b.run(t, "schedule", flag, "1", "e", "q").ok(t), "k    "+reason+"  ", flag)
		require.Contains(t, b.run(t, "schedule", flag, "2", "e", "q").ok(t), "k    awaiting discovery  ", flag)
	}
}

func TestPreview(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := demo(t, c)
		require.Equal(t, "no run would be served now\n", b.run(t, "preview", "-key-limit", "1", "prod", "builds").ok(t))
		// Without the limit, acme's ready run is next; initech's is ten
		// years away.
		require.Equal(t, lines(
			"#  KEY   ID     ATTEMPT",
			"1  acme  b-102  1",
		), b.run(t, "preview", "prod", "builds").ok(t))

		type runJSON struct {
			Key     string `json:"key"`
			ID      string `json:"id"`
			Attempt int    `json:"attempt"`
		}
		type previewJSON struct {
			Env   string    `json:"env"`
			Queue string    `json:"queue"`
			Runs  []runJSON `json:"runs"`
		}
		require.Equal(t, previewJSON{Env: "prod", Queue: "builds", Runs: []runJSON{{Key: "acme", ID: "b-102", Attempt: 1}}},
			decode[previewJSON](t, b.run(t, "preview", "-json", "-n", "3", "prod", "builds").ok(t)))
		require.Equal(t, previewJSON{Env: "prod", Queue: "builds", Runs: []runJSON{}},
			decode[previewJSON](t, b.run(t, "preview", "-json", "-key-limit", "1", "prod", "builds").ok(t)))
	})
}

// TestPreviewOrder: the preview lists runs in the order a fair dequeue
// serves them, as the library predicts.
func TestPreviewOrder(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, true, nil)
		for i, key := range []string{"a", "a", "a", "b", "c", "a", "b"} {
			_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", Key: key, ID: string(rune('1' + i))})
			require.NoError(t, err)
		}
		require.NoError(t, b.q.SetWeight(b.ctx, "e", "q", "a", 3))
		want, err := readOnly(t, b, nil).Preview(b.ctx, "e", "q", 5)
		require.NoError(t, err)
		require.Len(t, want, 5)
		type previewJSON struct {
			Env   string `json:"env"`
			Queue string `json:"queue"`
			Runs  []struct {
				Key     string `json:"key"`
				ID      string `json:"id"`
				Attempt int    `json:"attempt"`
			} `json:"runs"`
		}
		got := decode[previewJSON](t, b.run(t, "preview", "-json", "-n", "5", "e", "q").ok(t))
		require.Len(t, got.Runs, 5)
		for i, w := range want {
			require.Equal(t, []any{w.Key, w.ID, w.Attempt}, []any{got.Runs[i].Key, got.Runs[i].ID, got.Runs[i].Attempt})
		}
		// And a dequeue serves exactly that.
		runs, err := b.q.Dequeue(b.ctx, "e", "q", 5)
		require.NoError(t, err)
		for i, r := range runs {
			require.Equal(t, want[i].ID, r.ID)
		}
	})
}

type deadJSON struct {
	Key           string    `json:"key"`
	ID            string    `json:"id"`
	Attempt       int       `json:"attempt"`
	Priority      int       `json:"priority"`
	DiedAt        time.Time `json:"died_at"`
	PayloadBytes  int       `json:"payload_bytes"`
	Payload       *string   `json:"payload"`
	PayloadBase64 *string   `json:"payload_base64"`
	Corrupt       bool      `json:"corrupt"`
}

// deadListJSON is what dead list -json writes.
type deadListJSON struct {
	Env    string     `json:"env"`
	Queue  string     `json:"queue"`
	Total  int64      `json:"total"`
	Offset int        `json:"offset"`
	Runs   []deadJSON `json:"runs"`
}

func TestDeadLetters(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := demo(t, c)
		require.Equal(t, lines(
			"DIED AT                   KEY       ID     ATTEMPT  PRIORITY  PAYLOAD",
			"2023-11-14T22:13:20.000Z  globex    b-202  2        0         21 bytes",
			"2023-11-14T22:13:20.000Z  umbrella  b-401  2        0         8 bytes",
			"",
			"runs 1-2 of 2",
		), b.run(t, "dead", "list", "prod", "builds").ok(t))
		require.Equal(t, lines(
			"DIED AT                   KEY       ID     ATTEMPT  PRIORITY  PAYLOAD",
			"2023-11-14T22:13:20.000Z  umbrella  b-401  2        0         8 bytes",
			"",
			"runs 2-2 of 2",
		), b.run(t, "dead", "list", "-offset", "1", "-limit", "5", "prod", "builds").ok(t))
		require.Equal(t, "no dead-lettered runs at offset 2 (2 in all)\n",
			b.run(t, "dead", "list", "-offset", "2", "prod", "builds").ok(t))

		list := decode[deadListJSON](t, b.run(t, "dead", "list", "-json", "-limit", "1", "prod", "builds").ok(t))
		require.Equal(t, deadListJSON{Env: "prod", Queue: "builds", Total: 2, Offset: 0, Runs: []deadJSON{
			{Key: "globex", ID: "b-202", Attempt: 2, DiedAt: epoch.UTC(), PayloadBytes: 21},
		}}, list)

		require.Equal(t, lines(
			"env       prod",
			"queue     builds",
			"key       globex",
			"id        b-202",
			"attempt   2",
			"priority  0",
			"died at   2023-11-14T22:13:20.000Z",
			"payload   21 bytes",
			"",
			`{"repo":"globex/api"}`,
		), b.run(t, "dead", "show", "prod", "builds", "b-202", "-key", "globex").ok(t))
		require.Equal(t, lines(
			"env       prod",
			"queue     builds",
			"key       umbrella",
			"id        b-401",
			"attempt   2",
			"priority  0",
			"died at   2023-11-14T22:13:20.000Z",
			"payload   8 bytes, base64 below",
			"",
			"AAFiaW5hcnk=",
		), b.run(t, "dead", "show", "-key", "umbrella", "prod", "builds", "b-401").ok(t))
		require.Equal(t, "\x00\x01binary",
			b.run(t, "dead", "show", "-key", "umbrella", "-payload", "prod", "builds", "b-401").ok(t))

		type showJSON struct {
			Env   string `json:"env"`
			Queue string `json:"queue"`
			deadJSON
		}
		text, bin := `{"repo":"globex/api"}`, "AAFiaW5hcnk="
		require.Equal(t, showJSON{Env: "prod", Queue: "builds", deadJSON: deadJSON{Key: "globex", ID: "b-202", Attempt: 2,
			DiedAt: epoch.UTC(), PayloadBytes: 21, Payload: &text}},
			decode[showJSON](t, b.run(t, "dead", "show", "-json", "-key", "globex", "prod", "builds", "b-202").ok(t)))
		require.Equal(t, showJSON{Env: "prod", Queue: "builds", deadJSON: deadJSON{Key: "umbrella", ID: "b-401", Attempt: 2,
			DiedAt: epoch.UTC(), PayloadBytes: 8, PayloadBase64: &bin}},
			decode[showJSON](t, b.run(t, "dead", "show", "-json", "-key", "umbrella", "prod", "builds", "b-401").ok(t)))

		// The key is part of a run's name.
		r := b.run(t, "dead", "show", "prod", "builds", "b-202")
		require.Equal(t, cli.ExitFailure, r.code)
		require.Empty(t, r.stdout)
		require.Equal(t, `runqueue dead show: no dead-lettered run "b-202" (no concurrency key; pass -key KEY for a run `+
			`that has one) in queue "builds" of env "prod"`+"\n", r.stderr)
	})
}

// TestRedrive: a dead run goes back to its queue and is served again.
func TestRedrive(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := demo(t, c)
		require.Equal(t, "redriven run b-202 (key globex) of queue builds in env prod: back in its queue, ready now\n",
			b.run(t, "redrive", "prod", "builds", "b-202", "-key", "globex").ok(t))
		st, err := b.q.QueueStats(b.ctx, "prod", "builds")
		require.NoError(t, err)
		require.EqualValues(t, 2, st.Ready)
		require.EqualValues(t, 1, st.Dead)

		// A second call finds it live: nothing to do, not an error.
		require.Equal(t, "run b-202 (key globex) of queue builds in env prod is already live (queued or in flight): "+
			"nothing to redrive\n", b.run(t, "redrive", "prod", "builds", "b-202", "-key", "globex").ok(t))

		type redriveJSON struct {
			Env      string `json:"env"`
			Queue    string `json:"queue"`
			Key      string `json:"key"`
			ID       string `json:"id"`
			Redriven bool   `json:"redriven"`
		}
		require.Equal(t, redriveJSON{"prod", "builds", "umbrella", "b-401", true},
			decode[redriveJSON](t, b.run(t, "redrive", "-json", "-key", "umbrella", "prod", "builds", "b-401").ok(t)))

		r := b.run(t, "redrive", "prod", "builds", "nope")
		require.Equal(t, cli.ExitFailure, r.code)
		require.Contains(t, r.stderr, `runqueue redrive: no dead-lettered run "nope"`)

		// Redriven runs are served again, at attempt 1.
		require.NoError(t, b.q.SetWeight(b.ctx, "prod", "builds", "acme", 0.001)) // acme is gated anyway
		runs, err := b.q.Dequeue(b.ctx, "prod", "builds", 10)
		require.NoError(t, err)
		ids := map[string]int{}
		for _, r := range runs {
			ids[r.ID] = r.Attempt
		}
		require.Equal(t, map[string]int{"b-202": 1, "b-401": 1}, ids)
	})
}

func TestWeights(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := demo(t, c)
		require.Equal(t, lines("KEY     WEIGHT", "globex  2"), b.run(t, "weight", "list", "prod", "builds").ok(t))
		require.Equal(t, "weight of key acme in queue builds of env prod set to 0.25\n",
			b.run(t, "weight", "set", "prod", "builds", "acme", "0.25").ok(t))
		ws, err := b.q.Weights(b.ctx, "prod", "builds")
		require.NoError(t, err)
		require.Equal(t, map[string]float64{"acme": 0.25, "globex": 2}, ws)
		require.Equal(t, lines("KEY     WEIGHT", "acme    0.25", "globex  2"), b.run(t, "weight", "list", "prod", "builds").ok(t))

		type weightJSON struct {
			Key    string  `json:"key"`
			Weight float64 `json:"weight"`
		}
		type listJSON struct {
			Env     string       `json:"env"`
			Queue   string       `json:"queue"`
			Weights []weightJSON `json:"weights"`
		}
		require.Equal(t, listJSON{"prod", "builds", []weightJSON{{"acme", 0.25}, {"globex", 2}}},
			decode[listJSON](t, b.run(t, "weight", "list", "-json", "prod", "builds").ok(t)))

		// The scheduler sees it.
		require.Contains(t, b.run(t, "schedule", "-key-limit", "1", "prod", "builds").ok(t),
			"acme      at its limit        1    0.5  1    0.25")

		type setJSON struct {
			Env    string  `json:"env"`
			Queue  string  `json:"queue"`
			Key    string  `json:"key"`
			Weight float64 `json:"weight"`
		}
		require.Equal(t, setJSON{"prod", "builds", "globex", 1000},
			decode[setJSON](t, b.run(t, "weight", "set", "-json", "prod", "builds", "globex", "1e3").ok(t)))
		require.Equal(t, "weight of key acme in queue builds of env prod cleared: back to 1\n",
			b.run(t, "weight", "clear", "prod", "builds", "acme").ok(t))
		// A weight the scheduler holds as 1 (the nearest 0.001) clears too.
		require.Equal(t, "weight of key globex in queue builds of env prod cleared: 1.0004 is held as 1, the default\n",
			b.run(t, "weight", "set", "prod", "builds", "globex", "1.0004").ok(t))
		require.Equal(t, setJSON{"prod", "builds", "globex", 1},
			decode[setJSON](t, b.run(t, "weight", "set", "-json", "prod", "builds", "globex", "0.9996").ok(t)))
		require.Equal(t, "weight of key globex in queue builds of env prod set to 2\n",
			b.run(t, "weight", "set", "prod", "builds", "globex", "2").ok(t))
		require.Equal(t, setJSON{"prod", "builds", "globex", 1},
			decode[setJSON](t, b.run(t, "weight", "clear", "-json", "prod", "builds", "globex").ok(t)))
		ws, err = b.q.Weights(b.ctx, "prod", "builds")
		require.NoError(t, err)
		require.Empty(t, ws)
		require.Equal(t, "no weight overrides: every key has weight 1\n", b.run(t, "weight", "list", "prod", "builds").ok(t))
		require.Equal(t, listJSON{"prod", "builds", []weightJSON{}},
			decode[listJSON](t, b.run(t, "weight", "list", "-json", "prod", "builds").ok(t)))
	})
}

// TestRepair: the demo queue's age and delay indexes, depth counts and
// acme's lease lost; repair writes them back (the lease -lease from now),
// the queue's runs are served again, and a second repair finds nothing.
func TestRepair(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := demo(t, c)
		space, err := keys.NewSpace(b.prefix, b.q.Shards())
		require.NoError(t, err)
		qk := space.Env("prod").Queue("builds")
		sh := space.Shard(b.q.ShardOf("prod"))
		before, err := b.q.QueueStats(b.ctx, "prod", "builds")
		require.NoError(t, err)
		require.NoError(t, b.client.Del(b.ctx, qk.CkIndex(), qk.DelayIndex(), qk.Depth()).Err())
		leases, err := b.client.ZRange(b.ctx, sh.Leases(), 0, -1).Result()
		require.NoError(t, err)
		require.Len(t, leases, 1, "acme's run in flight")
		require.NoError(t, b.client.Del(b.ctx, sh.Leases()).Err())

		start := time.Now()
		require.Equal(t, lines("queue builds of env prod: 5 run(s) over 4 key(s) read",
			"repaired: 0 run(s) found in no set (0 queued again, 0 dead-lettered, 0 expired); 2 index entries added, "+
				"moved or removed; ready and delayed counts rewritten; shard index entry right; dead count right; "+
				"0 TTL entries added; 1 leases added; 0 keys' in-flight counts set"),
			b.run(t, "repair", "-lease", "1h", "prod", "builds").ok(t))
		deadline, err := b.client.ZScore(b.ctx, sh.Leases(), leases[0]).Result()
		require.NoError(t, err)
		require.InDelta(t, float64(start.Add(time.Hour).UnixMilli()), deadline, float64(time.Minute.Milliseconds()),
			"-lease from now (the command's clock)")
		after, err := b.q.QueueStats(b.ctx, "prod", "builds")
		require.NoError(t, err)
		require.Equal(t, before.Ready, after.Ready)
		require.Equal(t, before.Delayed, after.Delayed)

		type repairJSON struct {
			Env          string `json:"env"`
			Queue        string `json:"queue"`
			Runs         int    `json:"runs"`
			Orphans      int    `json:"orphans"`
			OrphansDead  int    `json:"orphans_dead"`
			OrphansGone  int    `json:"orphans_expired"`
			Keys         int    `json:"keys"`
			IndexEntries int    `json:"index_entries"`
			Depth        bool   `json:"depth"`
			Master       bool   `json:"master"`
			Dead         bool   `json:"dead"`
			TTLEntries   int    `json:"ttl_entries"`
			Leases       int    `json:"leases"`
			KeyCounts    int    `json:"key_counts"`
			Changed      bool   `json:"changed"`
		}
		require.Equal(t, repairJSON{Env: "prod", Queue: "builds", Runs: 5, Keys: 4},
			decode[repairJSON](t, b.run(t, "repair", "-json", "prod", "builds").ok(t)), "a second repair writes nothing")
		require.Equal(t, lines("queue builds of env prod: 5 run(s) over 4 key(s) read", "nothing to repair"),
			b.run(t, "repair", "prod", "builds").ok(t))
	})
}

// TestWriteNeedsDeployment: a write command refuses a prefix that holds
// no deployment (most often a mistyped -prefix) and writes nothing.
func TestWriteNeedsDeployment(t *testing.T) {
	t.Parallel()
	m, c := redistest.MiniServer(t)
	b := &bundle{ctx: t.Context(), client: c, url: urlOf(t, c), prefix: "nodeploy"}
	for _, args := range [][]string{
		{"weight", "set", "e", "q", "k", "2"},
		{"weight", "clear", "e", "q", "k"},
		{"redrive", "e", "q", "id"},
		{"repair", "e", "q"},
		{"dead", "delete", "e", "q", "id"},
		{"dead", "purge", "-before", "1h", "e", "q"},
	} {
		r := b.run(t, args...)
		require.Equal(t, cli.ExitFailure, r.code, args)
		require.Contains(t, r.stderr, `no runqueue deployment under prefix "nodeploy" (no layout version at {nodeploy:0}:layout): `+
			"check -prefix; nothing was written")
		require.Empty(t, m.Keys())
	}
}
