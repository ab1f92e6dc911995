package cli_test

// Review s33: the CLI on a populated deployment against the API. Every
// test is named TestS33*.

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/cli"
	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

var s33Backends = []redistest.Backend{
	{Name: "Real", Client: redistest.Real},
	{Name: "Cluster", Client: redistest.Cluster},
}

type s33Stats struct {
	Env              string  `json:"env"`
	Queue            *string `json:"queue"`
	Key              *string `json:"key"`
	Ready            int64   `json:"ready"`
	Delayed          int64   `json:"delayed"`
	InFlight         int64   `json:"in_flight"`
	Dead             *int64  `json:"dead"`
	OldestReadyAgeMS int64   `json:"oldest_ready_age_ms"`
}

// s33Populate fills prod with 4 queues: keyed runs, delayed runs, runs in
// flight (one queue holds only runs in flight and dead ones), dead runs,
// weights. The deployment runs on the wall clock.
func s33Populate(t *testing.T, c redis.UniversalClient) *bundle {
	t.Helper()
	b := setup(t, c, true, func(cfg *runqueue.Config) { cfg.Clock = nil; cfg.KeyConcurrency = 2 })
	ctx := b.ctx
	for qi, queue := range []string{"q0", "q1", "q2", "q3"} {
		for i := 0; i < 30; i++ {
			p := runqueue.EnqueueParams{Env: "prod", Queue: queue, Key: fmt.Sprintf("k%d", i%5), ID: fmt.Sprintf("%s-%d", queue, i),
				Priority: i % 3, Payload: []byte(fmt.Sprint(i))}
			if i%7 == 0 {
				p.Delay = time.Hour
			}
			_, err := b.q.Enqueue(ctx, p)
			require.NoError(t, err)
		}
		require.NoError(t, b.q.SetWeight(ctx, "prod", queue, "k1", float64(qi+2)))
		runs, err := b.q.Dequeue(ctx, "prod", queue, 6)
		require.NoError(t, err)
		for i, r := range runs {
			if i%2 == 0 {
				_, err = b.q.Nack(ctx, r, &runqueue.NackOptions{DeadLetter: true})
				require.NoError(t, err)
			}
		}
	}
	// q3: nothing queued, only in flight and dead.
	for {
		runs, err := b.q.Dequeue(ctx, "prod", "q3", 100)
		require.NoError(t, err)
		if len(runs) == 0 {
			break
		}
		for i, r := range runs {
			switch i % 3 {
			case 0:
				_, err = b.q.Nack(ctx, r, &runqueue.NackOptions{DeadLetter: true})
				require.NoError(t, err)
			case 1:
				require.NoError(t, b.q.Ack(ctx, r))
			}
		}
		// Delayed runs stay; drain the ready ones only.
		st, err := b.q.QueueStats(ctx, "prod", "q3")
		require.NoError(t, err)
		if st.Ready == 0 {
			break
		}
	}
	return b
}

func s33SameStats(t *testing.T, api runqueue.Stats, cliS s33Stats, what string) {
	t.Helper()
	require.Equal(t, api.Ready, cliS.Ready, what+" ready")
	require.Equal(t, api.Delayed, cliS.Delayed, what+" delayed")
	require.Equal(t, api.InFlight, cliS.InFlight, what+" in flight")
	if cliS.Dead != nil {
		require.Equal(t, api.Dead, *cliS.Dead, what+" dead")
	}
	require.InDelta(t, api.OldestReadyAge.Milliseconds(), cliS.OldestReadyAgeMS, 5000, what+" age")
}

// TestS33CLIPopulatedMatchesAPI: every read command's numbers on a
// populated deployment equal the API's, in JSON.
func TestS33CLIPopulatedMatchesAPI(t *testing.T) {
	t.Parallel()
	redistest.ForEachBackend(t, s33Backends, func(t *testing.T, c redis.UniversalClient) {
		b := s33Populate(t, c)
		ctx := b.ctx
		env, err := b.q.EnvStats(ctx, "prod")
		require.NoError(t, err)
		s33SameStats(t, env, decode[s33Stats](t, b.run(t, "stats", "-json", "prod").ok(t)), "env")
		var sum runqueue.Stats
		for _, queue := range []string{"q0", "q1", "q2", "q3"} {
			st, err := b.q.QueueStats(ctx, "prod", queue)
			require.NoError(t, err)
			sum.Ready += st.Ready
			sum.Delayed += st.Delayed
			sum.InFlight += st.InFlight
			sum.Dead += st.Dead
			s33SameStats(t, st, decode[s33Stats](t, b.run(t, "stats", "-json", "prod", queue).ok(t)), queue)
			for _, key := range []string{"k0", "k1", "", "nokey"} {
				ks, err := b.q.KeyStats(ctx, "prod", queue, key)
				require.NoError(t, err)
				got := decode[s33Stats](t, b.run(t, "stats", "-json", "prod", queue, key).ok(t))
				require.Nil(t, got.Dead)
				s33SameStats(t, ks, got, queue+"/"+key)
			}

			type deadRun struct {
				Key          string    `json:"key"`
				ID           string    `json:"id"`
				Attempt      int       `json:"attempt"`
				Priority     int       `json:"priority"`
				DiedAt       time.Time `json:"died_at"`
				PayloadBytes int       `json:"payload_bytes"`
			}
			type deadList struct {
				Env    string    `json:"env"`
				Queue  string    `json:"queue"`
				Total  int64     `json:"total"`
				Offset int       `json:"offset"`
				Runs   []deadRun `json:"runs"`
			}
			dl := decode[deadList](t, b.run(t, "dead", "list", "-json", "-limit", "2", "-offset", "1", "prod", queue).ok(t))
			require.Equal(t, st.Dead, dl.Total)
			api, err := b.q.DeadLetters(ctx, "prod", queue, 1, 2)
			require.NoError(t, err)
			require.Len(t, dl.Runs, len(api))
			for i, d := range api {
				require.Equal(t, deadRun{d.Key, d.ID, d.Attempt, d.Priority, d.DiedAt.UTC(), len(d.Payload)}, dl.Runs[i])
			}

			type weightJSON struct {
				Key    string  `json:"key"`
				Weight float64 `json:"weight"`
			}
			wl := decode[struct {
				Env     string       `json:"env"`
				Queue   string       `json:"queue"`
				Weights []weightJSON `json:"weights"`
			}](t, b.run(t, "weight", "list", "-json", "prod", queue).ok(t))
			ws, err := b.q.Weights(ctx, "prod", queue)
			require.NoError(t, err)
			require.Len(t, wl.Weights, len(ws))
			for _, w := range wl.Weights {
				require.Equal(t, ws[w.Key], w.Weight)
			}

			type runJSON struct {
				Key     string `json:"key"`
				ID      string `json:"id"`
				Attempt int    `json:"attempt"`
			}
			pv := decode[struct {
				Env   string    `json:"env"`
				Queue string    `json:"queue"`
				Runs  []runJSON `json:"runs"`
			}](t, b.run(t, "preview", "-json", "-n", "7", "-key-limit", "2", "prod", queue).ok(t))
			ro := s33ReadOnly(t, b, 2)
			want, err := ro.Preview(ctx, "prod", queue, 7)
			require.NoError(t, err)
			require.Len(t, pv.Runs, len(want))
			for i, r := range want {
				require.Equal(t, runJSON{r.Key, r.ID, r.Attempt}, pv.Runs[i], "preview %d", i)
			}
		}
		require.Equal(t, sum.Ready, env.Ready)
		require.Equal(t, sum.Delayed, env.Delayed)
		require.Equal(t, sum.InFlight, env.InFlight)
		require.Equal(t, sum.Dead, env.Dead)
	})
}

// s33ReadOnly opens the deployment read-only with key limit kl, as the
// CLI does.
func s33ReadOnly(t *testing.T, b *bundle, kl int) *runqueue.Queue {
	t.Helper()
	q, err := runqueue.New(b.ctx, b.client, &runqueue.Config{Prefix: b.prefix, VtimeScheduling: b.vtime, ReadOnly: true,
		KeyConcurrency: kl})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// TestS33CLIWrongLayout: a prefix written by another layout version: every
// command fails with exit 1 and says so on stderr, writing nothing.
func TestS33CLIWrongLayout(t *testing.T) {
	t.Parallel()
	redistest.ForEachBackend(t, s33Backends, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, true, nil)
		_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "prod", Queue: "q", ID: "1"})
		require.NoError(t, err)
		layoutKey := "{" + b.prefix + ":0}:layout"
		require.NoError(t, c.Set(b.ctx, layoutKey, "4", 0).Err())
		for _, args := range [][]string{
			{"stats", "prod"}, {"stats", "-json", "prod", "q"}, {"dead", "list", "prod", "q"},
			{"weight", "set", "prod", "q", "k", "2"}, {"redrive", "prod", "q", "1"},
		} {
			r := b.run(t, args...)
			require.Equal(t, cli.ExitFailure, r.code, "%v: %+v", args, r)
			require.Empty(t, r.stdout, args)
			require.Contains(t, r.stderr, "layout version 4", args)
		}
		ws, err := c.Get(b.ctx, layoutKey).Result()
		require.NoError(t, err)
		require.Equal(t, "4", ws)
	})
}

// TestS33CLIWriteVtimeFlag: a write command run with -vtime=false on a
// flag-on deployment (and with -vtime on a flag-off one) still takes
// effect for the deployment: a weight set shows in its Schedule, a
// redriven run is served by its dequeues.
func TestS33CLIWriteVtimeFlag(t *testing.T) {
	t.Parallel()
	redistest.ForEachBackend(t, s33Backends, func(t *testing.T, c redis.UniversalClient) {
		for _, deployVtime := range []bool{true, false} {
			b := setup(t, c, deployVtime, func(cfg *runqueue.Config) { cfg.Clock = nil })
			ctx := b.ctx
			for i := 0; i < 4; i++ {
				_, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: "prod", Queue: "q", Key: fmt.Sprintf("k%d", i%2),
					ID: fmt.Sprint(i)})
				require.NoError(t, err)
			}
			runs, err := b.q.Dequeue(ctx, "prod", "q", 1)
			require.NoError(t, err)
			require.Len(t, runs, 1)
			_, err = b.q.Nack(ctx, runs[0], &runqueue.NackOptions{DeadLetter: true})
			require.NoError(t, err)

			other := fmt.Sprintf("-vtime=%v", !deployVtime)
			base := []string{"-redis", b.url, "-prefix", b.prefix, other}
			runCLI(t, append(base, "weight", "set", "prod", "q", "k1", "4")...).ok(t)
			runCLI(t, append(base, "redrive", "-key", runs[0].Key, "prod", "q", runs[0].ID)...).ok(t)
			ws, err := b.q.Weights(ctx, "prod", "q")
			require.NoError(t, err)
			require.Equal(t, map[string]float64{"k1": 4}, ws)
			if deployVtime {
				s, err := b.q.Schedule(ctx, "prod", "q", 1)
				require.NoError(t, err)
				found := false
				for _, k := range s.Keys {
					if k.Key == "k1" {
						found = true
						require.Equal(t, 4.0, k.Weight)
					}
				}
				require.True(t, found)
			}
			// Every run, the redriven one included, is served.
			seen := map[string]bool{}
			for i := 0; i < 10 && len(seen) < 4; i++ {
				got, err := b.q.Dequeue(ctx, "prod", "q", 10)
				require.NoError(t, err)
				for _, r := range got {
					seen[r.ID] = true
					require.NoError(t, b.q.Ack(ctx, r))
				}
			}
			require.Len(t, seen, 4, "deploy vtime %v, cli %s", deployVtime, other)
		}
	})
}
