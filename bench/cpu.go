package main

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Redis process CPU. INFO commandstats counts the time inside commands
// only; the CPU a Redis user pays for also covers reading and parsing the
// requests, writing the replies, the event loop and the server's own
// threads. INFO cpu reports the process's getrusage (used_cpu_sys +
// used_cpu_user, in seconds, every thread included), which is the figure
// other queues (asynq, BullMQ) publish per job. Its deltas are
// server-wide, like the command statistics: measure on a Redis nothing
// else uses.

// redisCPU reads INFO cpu and returns used_cpu_sys + used_cpu_user of the
// Redis process, in microseconds.
func redisCPU(ctx context.Context, c redis.UniversalClient) (float64, error) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO cpu: %w", err)
	}
	return parseCPU(info)
}

// parseCPU sums used_cpu_sys and used_cpu_user (seconds) of INFO cpu into
// microseconds.
func parseCPU(info string) (float64, error) {
	var sum float64
	found := 0
	for line := range strings.Lines(info) {
		name, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "used_cpu_sys" && name != "used_cpu_user") {
			continue
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu line %q: %w", strings.TrimSpace(line), err)
		}
		sum += v
		found++
	}
	if found != 2 {
		return 0, fmt.Errorf("INFO cpu: used_cpu_sys and used_cpu_user not found in %q", info)
	}
	// INFO prints 6 decimals: round away the float noise of the seconds.
	return math.Round(sum * 1e6), nil
}

// cpuMeter measures the Redis process CPU of a phase: start before it,
// stop after it. On a cluster it reads every master.
type cpuMeter struct {
	c      redis.UniversalClient
	before map[string]float64 // node address -> µs
}

func startCPU(ctx context.Context, c redis.UniversalClient) (*cpuMeter, error) {
	v, err := nodesCPU(ctx, c)
	if err != nil {
		return nil, err
	}
	return &cpuMeter{c: c, before: v}, nil
}

// stop returns the microseconds of Redis process CPU since start, of all
// nodes together.
func (m *cpuMeter) stop(ctx context.Context) (float64, error) {
	total, _, err := m.stopNodes(ctx)
	return total, err
}

// stopNodes is stop with the microseconds of each node, by address.
func (m *cpuMeter) stopNodes(ctx context.Context) (total float64, byNode map[string]float64, err error) {
	after, err := nodesCPU(ctx, m.c)
	if err != nil {
		return 0, nil, err
	}
	byNode = map[string]float64{}
	for addr, v := range after {
		b, ok := m.before[addr]
		if !ok {
			return 0, nil, fmt.Errorf("INFO cpu: node %s joined during the phase", addr)
		}
		byNode[addr] = v - b
		total += v - b
	}
	return total, byNode, nil
}

// nodesCPU reads redisCPU on each node: the one server of a plain client,
// every master of a cluster client.
func nodesCPU(ctx context.Context, c redis.UniversalClient) (map[string]float64, error) {
	out := map[string]float64{}
	err := forEachNode(ctx, c, func(ctx context.Context, n *redis.Client) error {
		v, err := redisCPU(ctx, n)
		out[n.Options().Addr] = v
		return err
	})
	return out, err
}
