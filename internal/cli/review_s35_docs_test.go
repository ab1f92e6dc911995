package cli_test

// Session 35 docs audit: the CLI's help says "Flags default to the
// environment the deployment reads (runqueue.ConfigFromEnv), so that a
// command run beside it sees the same Config." The deployment reads
// RUNQUEUE_VTIME_QUANTUM into Config.Quantum, the unit of Schedule's tags
// and lags; the CLI reads (and validates) it but does not use it.

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

func TestS35DocsCLIQuantumFromEnv(t *testing.T) {
	c := redistest.Real(t)
	t.Setenv("RUNQUEUE_VTIME_QUANTUM", "1000")
	cfg, err := runqueue.ConfigFromEnv() // as the deployment does
	require.NoError(t, err)
	b := setup(t, c, true, func(c *runqueue.Config) { c.Quantum = cfg.Quantum })
	for _, id := range []string{"a", "b"} {
		_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", Key: "k", ID: id})
		require.NoError(t, err)
	}
	_, err = b.q.Dequeue(b.ctx, "e", "q", 1)
	require.NoError(t, err)
	want, err := b.q.Schedule(b.ctx, "e", "q", 1)
	require.NoError(t, err)
	require.Len(t, want.Keys, 1)

	out := b.run(t, "-json", "schedule", "e", "q").ok(t)
	var got struct {
		Keys []struct {
			Key string  `json:"key"`
			Tag float64 `json:"tag"`
			Lag float64 `json:"lag"`
		} `json:"keys"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.Len(t, got.Keys, 1)
	require.Equal(t, want.Keys[0].Tag, got.Keys[0].Tag,
		"deployment's Schedule (Quantum from RUNQUEUE_VTIME_QUANTUM) vs the CLI run beside it")
}
