package replication

import (
	"errors"
	"strings"
	"testing"
)

// A miss on a one-node ring has no per-node errors to report: the error
// still wraps ErrNotFound and prints no formatting residue.
func TestReadMissMessage(t *testing.T) {
	c := newCluster(t, []string{"a"}, nil)
	_, k := makeBlob(t, 11, 0)
	_, err := c.reps["a"].Read(t.Context(), k)
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("read of an absent key: %v, want ErrNotFound", err)
	}
	if strings.Contains(err.Error(), "%!") {
		t.Fatalf("error has a formatting residue: %q", err)
	}
}
