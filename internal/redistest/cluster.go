package redistest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterNodes is how many masters the spawned cluster has.
const clusterNodes = 3

// startCluster starts the Redis Cluster that Cluster shares: three
// redis-servers from bin, each the master of one range of slots, and no
// replicas.
func startCluster(bin string) (*deployment, error) {
	procs := make([]*proc, clusterNodes)
	errs := make([]error, clusterNodes)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Go(func() { procs[i], errs[i] = spawn(bin, true) })
	}
	wg.Wait()
	stop := func() {
		for _, p := range procs {
			if p != nil {
				p.kill()
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		stop()
		return nil, err
	}
	if err := formCluster(procs); err != nil {
		for _, p := range procs {
			err = fmt.Errorf("%w\n--- %s log:\n%s", err, p.addr, p.logTail())
		}
		stop()
		return nil, fmt.Errorf("forming a Redis Cluster: %w", err)
	}
	addrs := make([]string, len(procs))
	for i, p := range procs {
		addrs[i] = p.addr
	}
	return &deployment{
		addrs:  addrs,
		source: fmt.Sprintf("%s %d-node cluster of redis-server %s (%s)", originSpawned, len(procs), procs[0].version, bin),
		stop:   stop,
	}, nil
}

// slotRange is a range of hash slots, both ends included.
type slotRange struct{ start, end int }

// slotRanges splits the 16384 slots into n ranges of nearly equal size.
func slotRanges(n int) []slotRange {
	r := make([]slotRange, n)
	for i := range r {
		r[i] = slotRange{i * 16384 / n, (i+1)*16384/n - 1}
	}
	return r
}

// formCluster makes one cluster of the empty cluster-mode servers procs: each
// gets its range of slots and a distinct config epoch, the first meets the
// others, and formCluster waits until every node reports cluster_state:ok and
// the same slot map, the one it assigned.
func formCluster(procs []*proc) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	clients := make([]*redis.Client, len(procs))
	for i, p := range procs {
		clients[i] = redis.NewClient(&redis.Options{Addr: p.addr, MaxRetries: -1, DialTimeout: time.Second})
		defer func() { _ = clients[i].Close() }()
	}

	ranges := slotRanges(len(procs))
	want := map[slotRange]string{}
	for i, c := range clients {
		// Distinct epochs spare the nodes the collision resolution that
		// equal epochs would need before the slot map settles.
		if err := c.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return fmt.Errorf("%s: CLUSTER SET-CONFIG-EPOCH: %w", procs[i].addr, err)
		}
		r := ranges[i]
		if err := c.ClusterAddSlotsRange(ctx, r.start, r.end).Err(); err != nil {
			return fmt.Errorf("%s: CLUSTER ADDSLOTSRANGE %d %d: %w", procs[i].addr, r.start, r.end, err)
		}
		want[r] = procs[i].addr
	}
	for _, p := range procs[1:] {
		host, port, _ := strings.Cut(p.addr, ":")
		if err := clients[0].ClusterMeet(ctx, host, port).Err(); err != nil {
			return fmt.Errorf("%s: CLUSTER MEET %s: %w", procs[0].addr, p.addr, err)
		}
	}

	return poll(ctx, "agreement on the slot map", procs, func() error {
		for i, c := range clients {
			if err := nodeAgrees(ctx, c, len(procs), want); err != nil {
				return fmt.Errorf("%s: %w", procs[i].addr, err)
			}
		}
		return nil
	})
}

// nodeAgrees checks that the node of c knows n nodes, reports
// cluster_state:ok and serves slots exactly as want says.
func nodeAgrees(ctx context.Context, c *redis.Client, n int, want map[slotRange]string) error {
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		return err
	}
	if state := infoField(info, "cluster_state"); state != "ok" {
		return fmt.Errorf("cluster_state:%s", state)
	}
	if known := infoField(info, "cluster_known_nodes"); known != strconv.Itoa(n) {
		return fmt.Errorf("cluster_known_nodes:%s", known)
	}
	slots, err := c.ClusterSlots(ctx).Result()
	if err != nil {
		return err
	}
	got := map[slotRange]string{}
	for _, s := range slots {
		if len(s.Nodes) == 0 {
			return fmt.Errorf("slots %d-%d have no node", s.Start, s.End)
		}
		got[slotRange{s.Start, s.End}] = s.Nodes[0].Addr
	}
	if !mapsEqual(got, want) {
		return fmt.Errorf("slot map %v, want %v", got, want)
	}
	return nil
}

func mapsEqual(a, b map[slotRange]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// NodeOf returns the address of the master that serves key: on a cluster
// client, the node that owns key's hash slot in the client's view of the slot
// map; on a plain client, its one server. Tests use it to show which node a
// key, or an env's shard, lives on.
func NodeOf(ctx context.Context, c redis.UniversalClient, key string) (string, error) {
	switch c := c.(type) {
	case *redis.ClusterClient:
		n, err := c.MasterForKey(ctx, key)
		if err != nil {
			return "", fmt.Errorf("node of %q: %w", key, err)
		}
		return n.Options().Addr, nil
	case *redis.Client:
		return c.Options().Addr, nil
	default:
		return "", fmt.Errorf("node of %q: unsupported client %T", key, c)
	}
}

// Masters returns the addresses of the cluster's masters, sorted; on a plain
// client, its one server.
func Masters(ctx context.Context, c redis.UniversalClient) ([]string, error) {
	switch c := c.(type) {
	case *redis.ClusterClient:
		var mu sync.Mutex
		var addrs []string
		err := c.ForEachMaster(ctx, func(_ context.Context, n *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			addrs = append(addrs, n.Options().Addr)
			return nil
		})
		slices.Sort(addrs)
		return addrs, err
	case *redis.Client:
		return []string{c.Options().Addr}, nil
	default:
		return nil, fmt.Errorf("unsupported client %T", c)
	}
}

// Migration is the move of one hash slot from one master of a cluster to
// another, in the steps redis-cli --cluster reshard takes: the slot is
// IMPORTING on the target and MIGRATING on the source, its keys move a few
// at a time by MIGRATE, then every master learns the slot's new owner. A
// test runs its calls between the steps. Use it on [OwnCluster] only.
type Migration struct {
	Slot     int
	From, To *redis.Client
	fromID   string
	toID     string
	c        *redis.ClusterClient
}

// StartMigration opens the move of slot from the master serving it to
// another master.
func StartMigration(ctx context.Context, c *redis.ClusterClient, slot int) (*Migration, error) {
	m := &Migration{Slot: slot, c: c}
	var mu sync.Mutex
	var masters []*redis.Client
	if err := c.ForEachMaster(ctx, func(_ context.Context, n *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		masters = append(masters, n)
		return nil
	}); err != nil {
		return nil, err
	}
	ids := make([]string, len(masters))
	for i, n := range masters {
		id, err := n.Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			return nil, err
		}
		ids[i] = id
		slots, err := n.ClusterSlots(ctx).Result()
		if err != nil {
			return nil, err
		}
		for _, s := range slots {
			if s.Start <= slot && slot <= s.End && len(s.Nodes) > 0 && s.Nodes[0].ID == id {
				m.From, m.fromID = n, id
			}
		}
	}
	for i, n := range masters {
		if n != m.From && m.To == nil {
			m.To, m.toID = n, ids[i]
		}
	}
	if m.From == nil || m.To == nil || m.From == m.To {
		return nil, fmt.Errorf("slot %d: no source and target among %d masters", slot, len(masters))
	}
	if err := m.To.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", m.fromID).Err(); err != nil {
		return nil, fmt.Errorf("slot %d IMPORTING: %w", slot, err)
	}
	if err := m.From.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", m.toID).Err(); err != nil {
		return nil, fmt.Errorf("slot %d MIGRATING: %w", slot, err)
	}
	return m, nil
}

// MoveKeys moves up to n of the slot's keys still on the source and
// returns how many moved.
func (m *Migration) MoveKeys(ctx context.Context, n int) (int, error) {
	ks, err := m.From.ClusterGetKeysInSlot(ctx, m.Slot, n).Result()
	if err != nil || len(ks) == 0 {
		return 0, err
	}
	host, port, ok := strings.Cut(m.To.Options().Addr, ":")
	if !ok {
		return 0, fmt.Errorf("target address %q", m.To.Options().Addr)
	}
	args := []any{"MIGRATE", host, port, "", 0, 10000, "KEYS"}
	for _, k := range ks {
		args = append(args, k)
	}
	if err := m.From.Do(ctx, args...).Err(); err != nil {
		return 0, fmt.Errorf("MIGRATE %d keys: %w", len(ks), err)
	}
	return len(ks), nil
}

// Finish moves the keys left and gives the slot to the target on every
// master (the target first, as redis-cli does).
func (m *Migration) Finish(ctx context.Context) error {
	for {
		n, err := m.MoveKeys(ctx, 100)
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
	}
	if err := m.To.Do(ctx, "CLUSTER", "SETSLOT", m.Slot, "NODE", m.toID).Err(); err != nil {
		return err
	}
	if err := m.From.Do(ctx, "CLUSTER", "SETSLOT", m.Slot, "NODE", m.toID).Err(); err != nil {
		return err
	}
	return m.c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		if n == m.To || n == m.From {
			return nil
		}
		return n.Do(ctx, "CLUSTER", "SETSLOT", m.Slot, "NODE", m.toID).Err()
	})
}
