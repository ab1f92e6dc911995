package fairness

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/internal/schedfmt"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// LuaConfig configures a LuaPool.
type LuaConfig struct {
	Client redis.UniversalClient
	// Mini is the server behind Client when it is a miniredis: Advance and
	// ExpireState then move its TTL clock too (FastForward), so the
	// scheduler state expires by its own TTL. On a real Redis, ExpireState
	// deletes the state (expireSchedulerState).
	Mini        *miniredis.Miniredis
	Prefix      string
	StateTTL    time.Duration // 0: runqueue's default
	Lease       time.Duration // 0: one minute
	MaxAttempts int           // 0: runqueue's default
	// WindowMultiplier is runqueue's Config.WindowMultiplier; 0: default.
	WindowMultiplier int
}

// LuaPool holds a flag-on and a flag-off runqueue.Queue on one key space
// and one fake clock, shared by the drivers it makes (loading the scripts
// once). Each driver gets its own env on a shard of its own, so that the
// shard-wide sweeps (lease recovery, TTL) of one driver never see another's
// runs; drivers of one pool must not run concurrently (they share the clock).
type LuaPool struct {
	cfg     LuaConfig
	client  redis.UniversalClient // cfg.Client's server, a client of its own with replyHook
	replies map[string][]takenRun // a driver's ckIndex -> the runs its dequeue calls took
	clock   *Clock
	on, off *runqueue.Queue
	space   keys.Space

	mu     sync.Mutex
	limits map[string]Limits // env -> limits
	used   map[int]bool      // shards taken
	next   int
}

const luaShards = 16384

// NewLuaPool loads the scripts of both flag states on cfg.Client.
func NewLuaPool(ctx context.Context, cfg LuaConfig) (*LuaPool, error) {
	if cfg.Lease == 0 {
		cfg.Lease = time.Minute
	}
	p := &LuaPool{cfg: cfg, clock: NewClock(), limits: map[string]Limits{}, used: map[int]bool{},
		replies: map[string][]takenRun{}}
	switch c := cfg.Client.(type) {
	case *redis.Client:
		p.client = redis.NewClient(c.Options())
	case *redis.ClusterClient:
		p.client = redis.NewClusterClient(c.Options())
	default:
		return nil, fmt.Errorf("fairness: client %T not supported", cfg.Client)
	}
	p.client.AddHook(replyHook{p})
	base := runqueue.Config{Prefix: cfg.Prefix, Shards: luaShards, Clock: p.clock, LeaseDuration: cfg.Lease,
		MaxAttempts: cfg.MaxAttempts, StateTTL: cfg.StateTTL, WindowMultiplier: cfg.WindowMultiplier,
		LimitsFor: func(env, _ string) runqueue.Limits {
			p.mu.Lock()
			defer p.mu.Unlock()
			l := p.limits[env]
			return runqueue.Limits{Env: l.Env, Queue: l.Queue, Key: l.Key}
		}}
	for _, on := range []bool{true, false} {
		c := base
		c.VtimeScheduling = on
		q, err := runqueue.New(ctx, p.client, &c)
		if err != nil {
			if p.on != nil {
				_ = p.on.Close()
			}
			_ = p.client.Close()
			return nil, err
		}
		if on {
			p.on = q
		} else {
			p.off = q
		}
	}
	space, err := keys.NewSpace(cfg.Prefix, luaShards)
	if err != nil {
		p.Close()
		return nil, err
	}
	p.space = space
	return p, nil
}

// Config returns the flag-on instance's effective configuration.
func (p *LuaPool) Config() runqueue.Config { return p.on.Config() }

// Close closes both instances and the pool's own client (not cfg.Client).
func (p *LuaPool) Close() {
	_ = p.on.Close()
	_ = p.off.Close()
	_ = p.client.Close()
}

// takenRun is a run a dequeue script call took: delivered, or expired
// (swept at its key's head, or taken).
type takenRun struct {
	key, id        string
	expired, swept bool
}

// taken returns, and forgets, the runs the dequeue calls of the driver
// whose ckIndex is ck took since the last look, in the order taken.
func (p *LuaPool) taken(ck string) []takenRun {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.replies[ck]
	delete(p.replies, ck)
	return t
}

// replyHook reads the replies of the dequeue scripts the pool's queues
// send: the only place where the runs a call took past its TTL (deleted,
// not delivered) show among its serves, in the order taken. A dequeue
// call names its queue's ckIndex and delayIndex first (lib/dequeue); its
// reply is the acks' count (-1 - it when the scheduler state was found
// broken), their results, then four values a run: encoded id, variant
// member, record, delivery token (0: expired, -1: swept).
type replyHook struct{ p *LuaPool }

func (replyHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (replyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h replyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil {
			h.p.capture(cmd)
		}
		return err
	}
}

func (p *LuaPool) capture(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) < 5 {
		return
	}
	switch name, _ := args[0].(string); strings.ToLower(name) {
	case "evalsha", "eval", "fcall":
	default:
		return
	}
	ck, _ := args[3].(string)
	di, _ := args[4].(string)
	if !strings.HasSuffix(ck, ":ckIndex") || !strings.HasSuffix(di, ":delayIndex") {
		return
	}
	c, ok := cmd.(*redis.Cmd)
	if !ok {
		return
	}
	res, ok := c.Val().([]any)
	if !ok || len(res) == 0 {
		return
	}
	acks, _ := res[0].(int64)
	if acks < 0 {
		acks = -1 - acks
	}
	var got []takenRun
	for i := 1 + int(acks); i+3 < len(res); i += 4 {
		enc, _ := res[i].(string)
		vm, _ := res[i+1].(string)
		tok, _ := res[i+3].(int64)
		id, err := keys.DecodeSegment(enc)
		key, kerr := keys.DecodeVariantMember(vm)
		if err != nil || kerr != nil {
			continue
		}
		got = append(got, takenRun{key: key, id: id, expired: tok == 0 || tok == -1, swept: tok == -1})
	}
	p.mu.Lock()
	p.replies[ck] = append(p.replies[ck], got...)
	p.mu.Unlock()
}

// NewDriver returns a driver on a fresh base queue, flag on.
func (p *LuaPool) NewDriver(ctx context.Context) (*LuaDriver, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for tries := 0; tries < 100*luaShards; tries++ {
		p.next++
		env := fmt.Sprintf("fair:%d", p.next)
		shard := p.space.ShardOf(env)
		if p.used[shard] {
			continue
		}
		p.used[shard] = true
		const queue = "q*{fair}"
		return &LuaDriver{p: p, ctx: ctx, env: env, queue: queue, shard: shard,
			qk: p.space.Env(env).Queue(queue), flagOn: true, held: map[string]*runqueue.Run{}}, nil
	}
	return nil, errors.New("fairness: every shard of the pool is taken")
}

// LuaDriver drives one base queue through runqueue's public API: the Lua
// scripts, flag on or off.
type LuaDriver struct {
	p          *LuaPool
	ctx        context.Context
	env, queue string
	qk         keys.Queue
	shard      int
	flagOn     bool
	held       map[string]*runqueue.Run
}

func (d *LuaDriver) cur() *runqueue.Queue {
	if d.flagOn {
		return d.p.on
	}
	return d.p.off
}

// Enqueue implements Driver.
func (d *LuaDriver) Enqueue(key, id string, priority int, delay, ttl time.Duration) error {
	ok, err := d.cur().Enqueue(d.ctx, runqueue.EnqueueParams{Env: d.env, Queue: d.queue, Key: key, ID: id,
		Payload: []byte(id), Priority: priority, Delay: delay, TTL: ttl})
	if err == nil && !ok {
		err = fmt.Errorf("enqueue of %q was taken for a retry", id)
	}
	return err
}

// Dequeue implements Driver.
func (d *LuaDriver) Dequeue(maxCount int) ([]Served, error) {
	d.p.taken(d.qk.CkIndex())
	runs, err := d.cur().Dequeue(d.ctx, d.env, d.queue, maxCount)
	if err != nil {
		return nil, err
	}
	// The order the call took its runs in, the expired ones among them,
	// from the script's replies (see replyHook).
	byID := make(map[string]*runqueue.Run, len(runs))
	for _, r := range runs {
		byID[r.ID] = r
	}
	out := make([]Served, 0, len(runs))
	for _, t := range d.p.taken(d.qk.CkIndex()) {
		if t.expired {
			out = append(out, Served{Key: t.key, ID: t.id, Attempt: 1, Expired: true, Swept: t.swept})
			continue
		}
		if r := byID[t.id]; r != nil {
			delete(byID, t.id)
			d.held[r.ID] = r
			out = append(out, Served{Key: r.Key, ID: r.ID, Attempt: r.Attempt})
		}
	}
	for _, r := range runs {
		if byID[r.ID] != nil {
			return nil, fmt.Errorf("run %q served without a script reply naming it", r.ID)
		}
	}
	return out, nil
}

func (d *LuaDriver) run(id string) (*runqueue.Run, error) {
	r, ok := d.held[id]
	if !ok {
		return nil, fmt.Errorf("run %q is not held", id)
	}
	return r, nil
}

// Ack implements Driver.
func (d *LuaDriver) Ack(id string) error {
	r, err := d.run(id)
	if err != nil {
		return err
	}
	delete(d.held, id)
	return d.cur().Ack(d.ctx, r)
}

// Nack implements Driver.
func (d *LuaDriver) Nack(id string, retryAfter time.Duration, deadLetter bool) (bool, error) {
	r, err := d.run(id)
	if err != nil {
		return false, err
	}
	delete(d.held, id)
	res, err := d.cur().Nack(d.ctx, r, &runqueue.NackOptions{RetryAt: d.p.clock.Now().Add(retryAfter),
		DeadLetter: deadLetter})
	return res.Requeued, err
}

// RecoverLeases implements Driver.
func (d *LuaDriver) RecoverLeases() (int, error) {
	now := d.p.clock.Now()
	for id, r := range d.held {
		if !r.LeaseDeadline.After(now) {
			delete(d.held, id)
		}
	}
	return d.cur().RecoverLeases(d.ctx, d.shard, 100000)
}

// SweepTTL implements Driver.
func (d *LuaDriver) SweepTTL() (int, error) { return d.cur().ExpireTTL(d.ctx, d.shard, 100000) }

// SetWeight implements Driver.
func (d *LuaDriver) SetWeight(key string, w float64) error {
	return d.cur().SetWeight(d.ctx, d.env, d.queue, key, w)
}

// SetLimits implements Driver.
func (d *LuaDriver) SetLimits(l Limits) error {
	d.p.mu.Lock()
	defer d.p.mu.Unlock()
	d.p.limits[d.env] = l
	return nil
}

// Advance implements Driver.
func (d *LuaDriver) Advance(dt time.Duration) error {
	d.p.clock.Advance(dt)
	if d.p.cfg.Mini != nil {
		d.p.cfg.Mini.FastForward(dt)
	}
	return nil
}

// SetFlag implements FlagFlipper.
func (d *LuaDriver) SetFlag(on bool) error {
	d.flagOn = on
	return nil
}

// ExpireState implements StateExpirer: on miniredis the state's own TTL
// runs out (FastForward past StateTTL); on a real Redis the state is
// deleted, as its TTL would.
func (d *LuaDriver) ExpireState() error {
	if m := d.p.cfg.Mini; m != nil {
		m.FastForward(d.p.on.Config().StateTTL + time.Second)
		return nil
	}
	return expireSchedulerState(d.ctx, d.p.cfg.Client, d.qk)
}

// V implements ClockReader through the operator view.
func (d *LuaDriver) V() (float64, error) {
	s, err := d.p.on.Schedule(d.ctx, d.env, d.queue, 1)
	if errors.Is(err, runqueue.ErrTooLarge) {
		return 0, ErrVUnavailable
	}
	if err != nil {
		return 0, err
	}
	return s.V, nil
}

// StateExists implements StateProber.
func (d *LuaDriver) StateExists() (bool, error) {
	n, err := d.p.cfg.Client.Exists(d.ctx, schedulerKeys(d.qk)...).Result()
	return n > 0, err
}

// InLane implements LaneProber: key's registration in the state hash is
// marked waiting (the newcomer lane).
func (d *LuaDriver) InLane(key string) (bool, error) {
	v, err := d.p.cfg.Client.HGet(d.ctx, schedulerKeys(d.qk)[1], keys.VariantMember(key)).Result()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	reg, ok := schedfmt.ParseReg(v)
	if !ok {
		return false, fmt.Errorf("registration %q of %q does not parse", v, key)
	}
	return reg.Waiting, nil
}

// expireSchedulerState deletes the scheduler state of one base queue, as
// its TTL does when no scheduler write happened for StateTTL.
func expireSchedulerState(ctx context.Context, c redis.UniversalClient, qk keys.Queue) error {
	return c.Del(ctx, schedulerKeys(qk)...).Err()
}

// schedulerKeys are the keys of a base queue's scheduler state (weights
// excepted: configuration, they never expire). The names of the
// scheduler's keys appear here and nowhere else in this package.
func schedulerKeys(qk keys.Queue) []string {
	return []string{qk.CkVtime(), qk.CkVtimeState()}
}
