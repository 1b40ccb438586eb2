package respserver

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestMain fails the package's tests if they leave goroutines running.
func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }
