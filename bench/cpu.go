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
// stop after it.
type cpuMeter struct {
	c      redis.UniversalClient
	before float64
}

func startCPU(ctx context.Context, c redis.UniversalClient) (*cpuMeter, error) {
	v, err := redisCPU(ctx, c)
	if err != nil {
		return nil, err
	}
	return &cpuMeter{c: c, before: v}, nil
}

// stop returns the microseconds of Redis process CPU since start.
func (m *cpuMeter) stop(ctx context.Context) (float64, error) {
	v, err := redisCPU(ctx, m.c)
	if err != nil {
		return 0, err
	}
	return v - m.before, nil
}
