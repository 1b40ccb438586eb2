package node

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestLeftMarker: the marker refuses a start whatever its content (it
// exists only because a leave committed), Rejoin lets the start go on
// and clearLeftMarker removes it, and a directory without it starts.
func TestLeftMarker(t *testing.T) {
	tests := []struct {
		name    string
		content string // "": no marker
		rejoin  bool
		wantErr bool
	}{
		{"no marker", "", false, false},
		{"marker", `{"node_id":"n3","incarnation":7,"at":"2026-11-29T17:00:00Z"}`, false, true},
		{"unreadable marker", "{garbage", false, true},
		{"marker with rejoin", `{"node_id":"n3","incarnation":7}`, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.content != "" {
				if err := os.WriteFile(filepath.Join(dir, leftMarkerName), []byte(tc.content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			m, err := checkLeftMarker(dir, tc.rejoin)
			if gotErr := errors.Is(err, ErrLeftCluster); gotErr != tc.wantErr || (err != nil && !tc.wantErr) {
				t.Fatalf("checkLeftMarker: %v, want error %v", err, tc.wantErr)
			}
			if (m != nil) != (tc.content != "") {
				t.Fatalf("marker %+v for content %q", m, tc.content)
			}
			// Only a successful start clears the marker.
			_, statErr := os.Stat(filepath.Join(dir, leftMarkerName))
			if kept := statErr == nil; kept != (tc.content != "") {
				t.Fatalf("marker kept %v after the check, want %v", kept, tc.content != "")
			}
			if err := clearLeftMarker(dir); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(dir, leftMarkerName)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("marker after clearLeftMarker: %v", err)
			}
		})
	}
	dir := t.TempDir()
	want := leftMarker{NodeID: "n9", Incarnation: 42, At: time.Date(2026, 11, 29, 17, 0, 0, 0, time.UTC)}
	if err := writeLeftMarker(dir, want); err != nil {
		t.Fatal(err)
	}
	if m, err := checkLeftMarker(dir, false); !errors.Is(err, ErrLeftCluster) || m == nil || *m != want {
		t.Fatalf("written marker read back as %+v, %v", m, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("data dir holds %d entries after writing the marker, want 1 (no temporary left)", len(ents))
	}
}
