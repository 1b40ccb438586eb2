package units

import "testing"

func TestBytes(t *testing.T) {
	for _, tc := range []struct {
		b    uint64
		want string
	}{
		{0, "0B"}, {1023, "1023B"}, {1024, "1.0K"}, {1536, "1.5K"}, {3 << 20, "3.0M"}, {5 << 30, "5.0G"},
	} {
		if got := Bytes(tc.b); got != tc.want {
			t.Errorf("Bytes(%d) = %q, want %q", tc.b, got, tc.want)
		}
	}
}
