package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// On a Redis Cluster the throughput phases put one env on each master, so
// that every node gets work: an env's keys all live in the hash slot of its
// shard ({prefix:shard}, shard = Queue.ShardOf(env)), and the cluster's
// slot map says which master serves that slot. Runs and workers are dealt
// to the envs in turn, and the report breaks each phase down by node.

// ClusterNode is one master of the Redis Cluster the bench ran on.
type ClusterNode struct {
	Addr  string `json:"addr"`
	Slots int    `json:"slots"` // hash slots it serves
}

// topology is which master serves each hash slot, from CLUSTER SLOTS.
type topology struct {
	nodes []ClusterNode // sorted by address
	owner [16384]int    // slot -> index in nodes
}

// readTopology reads the slot map of a cluster client. Every slot must be
// served: the bench cannot run on a cluster that is not ok.
func readTopology(ctx context.Context, c *redis.ClusterClient) (*topology, error) {
	slots, err := c.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("CLUSTER SLOTS: %w", err)
	}
	var addrs []string
	for _, s := range slots {
		if len(s.Nodes) == 0 {
			return nil, fmt.Errorf("CLUSTER SLOTS: slots %d-%d have no master", s.Start, s.End)
		}
		if !slices.Contains(addrs, s.Nodes[0].Addr) {
			addrs = append(addrs, s.Nodes[0].Addr)
		}
	}
	slices.Sort(addrs)
	t := &topology{}
	for i := range t.owner {
		t.owner[i] = -1
	}
	for _, a := range addrs {
		t.nodes = append(t.nodes, ClusterNode{Addr: a})
	}
	for _, s := range slots {
		i := slices.Index(addrs, s.Nodes[0].Addr)
		for slot := s.Start; slot <= s.End; slot++ {
			t.owner[slot] = i
			t.nodes[i].Slots++
		}
	}
	for slot, i := range t.owner {
		if i < 0 {
			return nil, fmt.Errorf("CLUSTER SLOTS: slot %d has no master", slot)
		}
	}
	return t, nil
}

// nodeOfEnv returns the index of the master that serves env's keys in q.
func (t *topology) nodeOfEnv(q *runqueue.Queue, env string) (int, error) {
	space, err := keys.NewSpace(q.Config().Prefix, q.Shards())
	if err != nil {
		return 0, err
	}
	return t.owner[keys.Slot(space.Shard(q.ShardOf(env)).Tag())], nil
}

// spread picks one env per master for q: for master i, the first of
// "bench0", "bench1", ... whose shard it serves. ok is false when some
// master serves none of q's shards (the shards' slots depend on the prefix:
// a fresh prefix deals them anew).
func (t *topology) spread(q *runqueue.Queue) (envs []string, ok bool, err error) {
	envs = make([]string, len(t.nodes))
	found := 0
	// Every shard is reached within a few times Shards() names: ShardOf is
	// a hash of the name.
	for i := 0; found < len(envs) && i < 64*q.Shards(); i++ {
		env := benchEnv + strconv.Itoa(i)
		n, err := t.nodeOfEnv(q, env)
		if err != nil {
			return nil, false, err
		}
		if envs[n] == "" {
			envs[n] = env
			found++
		}
	}
	return envs, found == len(envs), nil
}

// clusterShards is the shard count of the bench's queues on a cluster of
// masters nodes: the default 16, or more on a large cluster, so that every
// master is likely to serve a shard.
func clusterShards(masters int) int { return max(16, 4*masters) }
