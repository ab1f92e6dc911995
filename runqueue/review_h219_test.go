package runqueue_test

// helper-219: Config.LimitsFor giving one env's queues different env
// limits, or changing them over time (lowered below the count, raised,
// lifted to 0), or negative ones: the caps hold for every call, and a
// refused limit writes nothing. (What the waiting lines do with limits
// that differ by queue: TestWorkerEnvLineWakeUpGoesOnToHigherLimit, and
// docs/design.md section 6 for the flag-on line.)

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

var h219Real = []redistest.Backend{{Name: "Real", Client: redistest.Real}}

// h219Limits is a LimitsFor whose env limit per queue can change.
type h219Limits struct {
	mu  sync.Mutex
	env map[string]int
	def int
}

func (l *h219Limits) setAll(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for q := range l.env {
		l.env[q] = n
	}
	l.def = n
}

func (l *h219Limits) set(queue string, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.env[queue] = n
}

func (l *h219Limits) get(_, queue string) runqueue.Limits {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n, ok := l.env[queue]; ok {
		return runqueue.Limits{Env: n}
	}
	return runqueue.Limits{Env: l.def}
}

func h219Setup(t *testing.T, c redis.UniversalClient, on bool, lim *h219Limits) *testBundle {
	return setup(t, c, func(cfg *runqueue.Config) {
		cfg.VtimeScheduling = on
		cfg.LimitsFor = lim.get
		cfg.BlockPollInterval = 30 * time.Second
	})
}

func h219EnvCount(t *testing.T, b *testBundle) int {
	n, err := b.client.Get(b.ctx, keySpace(t, b).Env(env).InflightCount()).Int()
	if err == redis.Nil {
		return 0
	}
	require.NoError(t, err)
	return n
}

// TestH219CapsHoldUnderDisagreeingLimits: random limits per queue, changed
// before every step (env limits disagreeing among the queues, lowered
// below the count, raised, lifted), random Dequeue, AckAndDequeue, Ack,
// Nack and DequeueShard calls, both flags: after every call that served
// runs of one queue, the env's, the queue's and each key's in-flight
// counts are within the limits that call was given.
func TestH219CapsHoldUnderDisagreeingLimits(t *testing.T) {
	t.Parallel()
	forEachBackendH219 := []redistest.Backend{{Name: "Mini", Client: redistest.Mini}, {Name: "Real", Client: redistest.Real}}
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			redistest.ForEachBackend(t, forEachBackendH219, func(t *testing.T, c redis.UniversalClient) {
				var mu sync.Mutex
				lims := map[string]runqueue.Limits{}
				b := setup(t, c, func(cfg *runqueue.Config) {
					cfg.VtimeScheduling = on
					cfg.SerialCalls = true
					cfg.LimitsFor = func(_, q string) runqueue.Limits {
						mu.Lock()
						defer mu.Unlock()
						return lims[q]
					}
				})
				sp := keySpace(t, b)
				queues := []string{"qa", "qb", "qc"}
				rng := rand.New(rand.NewPCG(219, 7))
				var held []*runqueue.Run
				seq, checked := 0, 0
				check := func(step int, q string, runs []*runqueue.Run, l runqueue.Limits) {
					if len(runs) == 0 {
						return
					}
					checked++
					en := h219EnvCount(t, b)
					if l.Env > 0 {
						require.LessOrEqual(t, en, l.Env, "step %d: env in flight after a call of %s under %+v", step, q, l)
					}
					qk := sp.Env(env).Queue(q)
					hn, err := c.HLen(b.ctx, qk.Held()).Result()
					require.NoError(t, err)
					if l.Queue > 0 {
						require.LessOrEqual(t, int(hn), l.Queue, "step %d: %s in flight under %+v", step, q, l)
					}
					if l.Key > 0 {
						kin, err := c.HGetAll(b.ctx, qk.KeyInflight()).Result()
						require.NoError(t, err)
						for _, r := range runs {
							k := keys.VariantMember(r.Key)
							v := kin[k]
							n := 0
							if v != "" {
								var err error
								n, err = strconv.Atoi(v)
								require.NoError(t, err)
							}
							require.LessOrEqual(t, n, l.Key, "step %d: key %s of %s in flight under %+v", step, k, q, l)
						}
					}
				}
				steps := 1500
				for step := range steps {
					mu.Lock()
					for _, q := range queues {
						lims[q] = runqueue.Limits{Env: rng.IntN(5), Queue: rng.IntN(4), Key: rng.IntN(3)}
					}
					mu.Unlock()
					for range rng.IntN(3) {
						q := queues[rng.IntN(3)]
						seq++
						_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: q, Key: fmt.Sprintf("k%d", rng.IntN(3)), ID: fmt.Sprintf("r%05d", seq)})
						require.NoError(t, err)
					}
					q := queues[rng.IntN(3)]
					mu.Lock()
					l := lims[q]
					mu.Unlock()
					switch op := rng.IntN(10); {
					case op < 3:
						runs, err := b.q.Dequeue(b.ctx, env, q, 1+rng.IntN(3))
						require.NoError(t, err)
						held = append(held, runs...)
						check(step, q, runs, l)
					case op < 6:
						var acks, rest []*runqueue.Run
						for _, r := range held {
							if r.Queue == q && rng.IntN(2) == 0 && len(acks) < 3 {
								acks = append(acks, r)
							} else {
								rest = append(rest, r)
							}
						}
						runs, _, err := b.q.AckAndDequeue(b.ctx, acks, env, q, 1+rng.IntN(3))
						require.NoError(t, err)
						rest = append(rest, runs...)
						held = rest
						check(step, q, runs, l)
					case op < 8 && len(held) > 0:
						i := rng.IntN(len(held))
						r := held[i]
						held = append(held[:i], held[i+1:]...)
						if rng.IntN(2) == 0 {
							require.NoError(t, b.q.Ack(b.ctx, r))
						} else {
							_, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: b.clock.Now()})
							require.NoError(t, err)
						}
					case op < 10:
						runs, err := b.q.DequeueShard(b.ctx, b.q.ShardOf(env), 1+rng.IntN(4))
						require.NoError(t, err)
						held = append(held, runs...)
						// (one queue served: its limits applied to the call)
						one := len(runs) > 0
						for _, r := range runs {
							one = one && r.Queue == runs[0].Queue
						}
						if one {
							mu.Lock()
							lq := lims[runs[0].Queue]
							mu.Unlock()
							check(step, runs[0].Queue, runs, lq)
						}
					}
					b.clock.Advance(time.Millisecond)
				}
				t.Logf("%d calls that served runs checked against their limits", checked)
				if len(held) > 0 {
					_, err := b.q.AckMany(b.ctx, held)
					require.NoError(t, err)
				}
				require.Equal(t, 0, h219EnvCount(t, b), "every slot back")
			})
		})
	}
}

// TestH219NegativeLimits: a negative limit from LimitsFor is an
// *InvalidError of the dequeue, nothing written; AckAndDequeue still makes
// its acks (their results with the error); a Worker logs and retries.
func TestH219NegativeLimits(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			redistest.ForEachBackend(t, h219Real, func(t *testing.T, c redis.UniversalClient) {
				lim := &h219Limits{env: map[string]int{}, def: 2}
				b := h219Setup(t, c, on, lim)
				ewEnqueue(t, b, "qa", 3)
				a, _, err := b.q.AckAndDequeue(b.ctx, nil, env, "qa", 1)
				require.NoError(t, err)
				require.Len(t, a, 1)
				lim.setAll(-1)
				before := b.dump(t)
				_, err = b.q.Dequeue(b.ctx, env, "qa", 1)
				require.ErrorIs(t, err, runqueue.ErrInvalid)
				t.Logf("Dequeue: %v", err)
				require.Equal(t, before, b.dump(t), "nothing written")
				_, err = b.q.DequeueShard(b.ctx, b.q.ShardOf(env), 1)
				t.Logf("DequeueShard: %v", err)
				require.Equal(t, before, b.dump(t), "nothing written")
				runs, errs, err := b.q.AckAndDequeue(b.ctx, a, env, "qa", 1)
				require.ErrorIs(t, err, runqueue.ErrInvalid)
				require.Empty(t, runs)
				require.Equal(t, []error{nil}, errs, "the ack made")
				require.Equal(t, 0, h219EnvCount(t, b))
			})
		})
	}
}
