package meta

import (
	"strings"
	"testing"
)

// TestLeaveOf: the node's check of forwarded leaves reads the leaving ID
// of exactly the well-formed leave commands.
func TestLeaveOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		cmd  []byte
		id   string
		ok   bool
	}{
		{"leave", mustEncode(t, leave{ID: "n3", Incarnation: 7}), "n3", true},
		{"hand-encoded leave", append([]byte{1, 6}, `{"id":"n2"}`...), "n2", true},
		{"settings", mustEncode(t, setSettings{Settings: DefaultSettings()}), "", false},
		{"ring change", mustEncode(t, ringChange{Epoch: 1, Remove: []string{"n3"}}), "", false},
		{"leave without an ID", mustEncode(t, leave{}), "", false},
		{"leave with a huge ID", mustEncode(t, leave{ID: strings.Repeat("x", 300)}), "", false},
		{"leave of another version", append([]byte{2, byte(kindLeave)}, `{"id":"n3"}`...), "", false},
		{"truncated", []byte{cmdVersion, byte(kindLeave), '{'}, "", false},
		{"empty", nil, "", false},
	} {
		id, ok := LeaveOf(tc.cmd)
		if id != tc.id || ok != tc.ok {
			t.Errorf("%s: LeaveOf = %q %v, want %q %v", tc.name, id, ok, tc.id, tc.ok)
		}
	}
}
