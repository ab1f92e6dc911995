package cli

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWriteCommands: the commands that write are the ones the help's
// footer names (every other command opens the queues read-only).
func TestWriteCommands(t *testing.T) {
	t.Parallel()
	var writes []string
	for _, c := range commands {
		if c.write {
			writes = append(writes, c.name)
			require.True(t, strings.HasSuffix(c.summary, "(writes)"), c.name)
		}
	}
	require.Equal(t, []string{"dead delete", "dead purge", "redrive", "repair", "weight set", "weight clear"}, writes)
	require.Contains(t, strings.Join(strings.Fields(footer), " "),
		"Only dead delete, dead purge, redrive, repair, weight set and weight clear write to Redis")
}
