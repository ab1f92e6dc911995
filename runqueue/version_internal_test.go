package runqueue

import "testing"

// versionBelow compares by major and minor number against MinRedisVersion,
// and passes a version it cannot read.
func TestVersionBelow(t *testing.T) {
	for _, c := range []struct {
		v     string
		below bool
	}{
		{MinRedisVersion, false}, {"6.2.14", false}, {"6.3.0", false}, {"7.0.15", false}, {"10.0.0", false},
		{"6.1.240", true}, {"6.0.16", true}, {"5.9.9", true}, {"0.1", true},
		{"", false}, {"7", false}, {"unstable", false}, {"v6.0.16", false}, {"6.x", false},
	} {
		if got := versionBelow(c.v, MinRedisVersion); got != c.below {
			t.Errorf("versionBelow(%q, %q) = %v, want %v", c.v, MinRedisVersion, got, c.below)
		}
	}
	if !versionBelow("6.2.0", "7.0.0") || versionBelow("7.0.0", "7.0.0") {
		t.Error("versionBelow does not follow its min argument")
	}
	if got := infoField("# Server\r\nredis_version: 6.0.16 \r\nredis_mode:standalone\r\n", "redis_version"); got != "6.0.16" {
		t.Errorf("infoField = %q", got)
	}
}
