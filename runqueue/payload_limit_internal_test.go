package runqueue

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
)

// TestMaxPayloadLimitLeavesRoomForTheHeader: a record is its payload
// behind a header, sent to Redis as one argument, which Redis refuses past
// proto-max-bulk-len (512 MiB by default). MaxPayloadLimit leaves 4 KiB
// below that; the longest header, of the longest key in the encoding that
// grows most, the largest priority and times, is within 1 KiB of it. (A
// payload of 512 MiB, the bound before, made a record Redis refused: a
// connection reset after go-redis sent it four times, and no typed error.)
func TestMaxPayloadLimitLeavesRoomForTheHeader(t *testing.T) {
	longest := 0
	for r := rune(' '); r < 0x800; r++ {
		if !utf8.ValidRune(r) || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			continue
		}
		key := strings.Repeat(string(r), MaxNameBytes/utf8.RuneLen(r))
		if checkName("key", key) != nil {
			continue
		}
		rec, off := appendRecord(nil, MaxPriority, MaxTimeUnixMilli, MaxTimeUnixMilli, keys.VariantMember(key), nil)
		require.Equal(t, len(rec)+1, off)
		longest = max(longest, len(rec))
	}
	require.Greater(t, longest, 2*MaxNameBytes, "some key grows in the encoding")
	require.LessOrEqual(t, longest, 1<<10, "the longest header")
	require.Equal(t, 512<<20, MaxPayloadLimit+4<<10)
}
