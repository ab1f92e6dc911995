package main

// Review of a565956 (the enqueue_new_key cost row) and 906c4ef.
//
// TestCallgrindCost now asserts that flag on, enqueue_new_key counts more
// instructions per run than enqueue. That holds whatever the scheduler
// does: flag off, where nothing registers, a key's first run already costs
// more than a run behind its head (the key's set, its ckIndex entry), as
// the tests below show. What says that the row measures the registration
// is the flag-on extra of a new key over the flag-off one, beyond the
// flag-on extra of a known key: asserted here in Redis commands (exact, no
// valgrind), and in instructions by TestCallgrindCost (its "registration
// shows in the new-key row"; this file's own callgrind run of the same
// check was dropped as a second valgrind run of the cost section).

import (
	"context"
	"io"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

func reviewRow(t *testing.T, rep *Report, op, flag string) CostRow {
	t.Helper()
	i := slices.IndexFunc(rep.Cost, func(r CostRow) bool { return r.Op == op && r.Flag == flag })
	require.GreaterOrEqual(t, i, 0, "%s flag %s", op, flag)
	return rep.Cost[i]
}

func reviewNewKeyOptions() Options {
	opts := tinyOptions()
	opts.Sections = map[string]bool{secCost: true}
	opts.CostRuns, opts.CostKeys, opts.GatedCalls = 200, 10, 40
	return opts
}

// TestReviewNewKeyRowCommands: by the commands the scripts run per run
// (exact), flag on a new key's enqueue runs the registration's commands on
// top of what flag off runs; a known key's does not (or far fewer).
func TestReviewNewKeyRowCommands(t *testing.T) {
	url, _ := emptyDB(t, 6)
	opts := reviewNewKeyOptions()
	opts.RedisURL = url
	rep, err := run(context.Background(), opts, io.Discard, io.Discard)
	require.NoError(t, err)
	get := func(op, flag string) float64 {
		r := reviewRow(t, rep, op, flag)
		require.NotNil(t, r.InnerCallsPerRun, "%s %s", op, flag)
		return *r.InnerCallsPerRun
	}
	newOn, newOff := get("enqueue_new_key", "on"), get("enqueue_new_key", "off")
	knownOn, knownOff := get("enqueue", "on"), get("enqueue", "off")
	t.Logf("redis.calls per run: new key on %.2f off %.2f; enqueue on %.2f off %.2f", newOn, newOff, knownOn, knownOff)
	require.Greater(t, newOn-newOff, knownOn-knownOff+1, "the registration shows in the new-key row")
	// Flag off, nothing registers, and a new key still costs more: the
	// test's newKey(on) > enqueue(on) does not need the scheduler.
	require.Greater(t, newOff, knownOff)
}
