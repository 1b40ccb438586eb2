package buildinfo

import (
	"strings"
	"testing"
)

// A build without a commit (no VCS stamp, no -X) says "unknown".
func TestStringWithoutCommit(t *testing.T) {
	if s := (Info{Version: "(devel)", GoVersion: "go1"}).String(); s != "(devel) (commit unknown, go1)" {
		t.Fatalf("String() = %q", s)
	}
	if s := (Info{Version: "v1.2.3", Commit: "abc", Modified: true, GoVersion: "go1"}).String(); !strings.Contains(s, "commit abc+modified") {
		t.Fatalf("String() = %q", s)
	}
}
