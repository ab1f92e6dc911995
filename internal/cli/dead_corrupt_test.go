package cli_test

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
)

// TestDeadLettersCorrupt: a dead-lettered run whose stored record does
// not parse (a hand edit, a writer's bug) was listed like one with an
// empty payload at attempt 0; it now says its record does not parse.
func TestDeadLettersCorrupt(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := demo(t, c)
		space, err := keys.NewSpace(b.prefix, b.q.Shards())
		require.NoError(t, err)
		runs := space.Env("prod").Queue("builds").Runs()
		require.NoError(t, b.client.HSet(b.ctx, runs, keys.Segment("b-401"), "not a record").Err())
		require.Equal(t, lines(
			"DIED AT                   KEY       ID     ATTEMPT  PRIORITY  PAYLOAD",
			"2023-11-14T22:13:20.000Z  globex    b-202  2        0         21 bytes",
			"2023-11-14T22:13:20.000Z  umbrella  b-401  0        0         record does not parse",
			"",
			"runs 1-2 of 2",
		), b.run(t, "dead", "list", "prod", "builds").ok(t))
		list := decode[deadListJSON](t, b.run(t, "dead", "list", "-json", "prod", "builds").ok(t))
		require.Len(t, list.Runs, 2)
		require.False(t, list.Runs[0].Corrupt)
		require.True(t, list.Runs[1].Corrupt)
		require.Equal(t, lines(
			"env       prod",
			"queue     builds",
			"key       umbrella",
			"id        b-401",
			"attempt   0",
			"priority  0",
			"died at   2023-11-14T22:13:20.000Z",
			"payload   record does not parse",
		), b.run(t, "dead", "show", "prod", "builds", "b-401", "-key", "umbrella").ok(t))
	})
}
