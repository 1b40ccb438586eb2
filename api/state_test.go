package api

import "testing"

func TestSplitState(t *testing.T) {
	for _, tc := range []struct{ in, state, why string }{
		{"ready", StateReady, ""},
		{"recovering: startup pull running", StateRecovering, "startup pull running"},
		{"joining: no raft leader", StateJoining, "no raft leader"},
		{"left: drained and left the cluster", StateLeft, "drained and left the cluster"},
		{"", "", ""},
	} {
		if state, why := SplitState(tc.in); state != tc.state || why != tc.why {
			t.Errorf("SplitState(%q) = %q, %q; want %q, %q", tc.in, state, why, tc.state, tc.why)
		}
	}
}
