package daemon

import (
	"testing"
	"time"
)

// TestFormatDefaults: the flag defaults read from the packages print as
// before and parse back to the same value.
func TestFormatDefaults(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{{30 * time.Second, "30s"}, {15 * time.Minute, "15m"}, {100 * time.Millisecond, "100ms"}, {3 * time.Hour, "3h"}, {90 * time.Second, "1m30s"}} {
		got := FormatDuration(c.d)
		if got != c.want {
			t.Errorf("FormatDuration(%v) = %q, want %q", c.d, got, c.want)
		}
		if back, err := time.ParseDuration(got); err != nil || back != c.d {
			t.Errorf("%q parses to %v, %v", got, back, err)
		}
	}
	for _, c := range []struct {
		n    int64
		want string
	}{{64 << 20, "64M"}, {1 << 30, "1G"}, {1536 << 10, "1536K"}, {1000, "1000"}, {0, "0"}} {
		got := FormatBytes(c.n)
		if got != c.want {
			t.Errorf("FormatBytes(%d) = %q, want %q", c.n, got, c.want)
		}
		if back, err := ParseBytes(got); err != nil || back != c.n {
			t.Errorf("%q parses to %d, %v", got, back, err)
		}
	}
}
