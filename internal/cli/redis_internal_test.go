package cli

import (
	"crypto/tls"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestDial: which -redis values make a single-server client and which a
// cluster client, with which addresses, credentials and TLS.
func TestDial(t *testing.T) {
	t.Parallel()
	type want struct {
		cluster  bool
		addrs    []string
		user     string
		password string
		db       int
		tls      bool
	}
	for raw, w := range map[string]want{
		"localhost:6379":                           {addrs: []string{"localhost:6379"}},
		"redis://localhost:6380":                   {addrs: []string{"localhost:6380"}},
		"redis://u:p@localhost:6380/3":             {addrs: []string{"localhost:6380"}, user: "u", password: "p", db: 3},
		"rediss://:p@cache.example:6380":           {addrs: []string{"cache.example:6380"}, password: "p", tls: true},
		"a:1,b:2":                                  {cluster: true, addrs: []string{"a:1", "b:2"}},
		" a:1 , b:2 ":                              {cluster: true, addrs: []string{"a:1", "b:2"}},
		"redis+cluster://a:1":                      {cluster: true, addrs: []string{"a:1"}},
		"redis+cluster://u:p@a:1,b:2,c:3":          {cluster: true, addrs: []string{"a:1", "b:2", "c:3"}, user: "u", password: "p"},
		"rediss+cluster://a:1,b:2?read_timeout=5s": {cluster: true, addrs: []string{"a:1", "b:2"}, tls: true},
		"redis://a:1,b:2":                          {cluster: true, addrs: []string{"a:1", "b:2"}},
		"REDIS+CLUSTER://a:1,b:2":                  {cluster: true, addrs: []string{"a:1", "b:2"}},
	} {
		t.Run(raw, func(t *testing.T) {
			t.Parallel()
			e, err := dial(raw, 1500*time.Millisecond)
			require.NoError(t, err)
			t.Cleanup(func() { _ = e.client.Close() })
			require.Equal(t, w.addrs, e.addrs)
			var user, password string
			var db int
			var tlsc *tls.Config
			var dialTimeout time.Duration
			switch c := e.client.(type) {
			case *redis.ClusterClient:
				require.True(t, w.cluster)
				o := c.Options()
				require.Equal(t, w.addrs, o.Addrs)
				user, password, tlsc, dialTimeout = o.Username, o.Password, o.TLSConfig, o.DialTimeout
			case *redis.Client:
				require.False(t, w.cluster)
				o := c.Options()
				user, password, db, tlsc, dialTimeout = o.Username, o.Password, o.DB, o.TLSConfig, o.DialTimeout
			}
			require.Equal(t, []any{w.user, w.password, w.db, w.tls}, []any{user, password, db, tlsc != nil})
			require.Equal(t, 1500*time.Millisecond, dialTimeout)
		})
	}
}

func TestDialURLTimeoutWins(t *testing.T) {
	t.Parallel()
	e, err := dial("redis://localhost:6379?dial_timeout=7s", time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.client.Close() })
	require.Equal(t, 7*time.Second, e.client.(*redis.Client).Options().DialTimeout)
}

func TestDialRejects(t *testing.T) {
	t.Parallel()
	for raw, msg := range map[string]string{
		"":                             "-redis is empty",
		"http://localhost":             `unsupported scheme "http"`,
		"unix+cluster:///tmp/s":        `unsupported scheme "unix+cluster"`,
		"a:1,,b:2":                     `empty address in "a:1,,b:2"`,
		"redis+cluster://":             `empty address in ""`,
		"redis://u:secret@h:1?bogus=1": "redis://u:xxxxx@h:1?bogus=1",
	} {
		_, err := dial(raw, time.Second)
		var ue *usageError
		require.True(t, errors.As(err, &ue), "%q: %v", raw, err)
		require.Contains(t, err.Error(), msg, raw)
		require.NotContains(t, err.Error(), "secret")
	}
}
