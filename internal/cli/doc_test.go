package cli

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCommandDocListsEveryCommand: the package comment of cmd/runqueue
// (what go doc and pkg.go.dev show) lists every command as help does.
func TestCommandDocListsEveryCommand(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../cmd/runqueue/doc.go")
	require.NoError(t, err)
	for _, c := range commands {
		line := "//\trunqueue " + c.name + " " + c.args
		require.Contains(t, string(doc), line+" ", c.name)
		require.Contains(t, string(doc), c.summary, c.name)
	}
}
