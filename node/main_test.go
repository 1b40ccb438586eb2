package node

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestMain fails the package's tests if they leave goroutines running.
// raft's NetworkTransport.Close leaves its pooled outgoing connections
// open (only CloseStreams closes them), so the reader of each one on the
// peer's side (handleConn) runs until the test binary exits.
func TestMain(m *testing.M) {
	testutil.VerifyNoLeaks(m, "github.com/hashicorp/raft.(*NetworkTransport).handleConn")
}
