//go:build !cuda

package kvtier

import (
	"errors"
	"testing"
)

// TestOpenGPUWithoutCUDA: a build without the cuda tag has no GPU tier to
// open, and says so.
func TestOpenGPUWithoutCUDA(t *testing.T) {
	d, err := OpenGPU(GPUConfig{Device: 0, Bytes: 1 << 20})
	if d != nil || !errors.Is(err, ErrNoCUDA) {
		t.Fatalf("OpenGPU: %v, %v; want ErrNoCUDA", d, err)
	}
}
