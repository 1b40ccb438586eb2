package cudakern

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// fakeGPU is a GPU whose kernel is a CPU Injector; it records its use.
type fakeGPU struct {
	err    error
	k      *Injector
	device int
}

func (g *fakeGPU) Kernel(device int) (Kernel, string, error) {
	g.device = device
	if g.err != nil {
		return nil, "", g.err
	}
	g.k = NewInjector(Config{Workers: 1})
	return g.k, "fake gpu", nil
}

func (g *fakeGPU) OpenIPC(int, [][]byte, []int64, []int) (DeviceCache, error) {
	return nil, errors.New("not here")
}

func TestNewKernelChoosesDevice(t *testing.T) {
	k, why, onGPU := NewKernel(nil, 0, Config{Workers: 1})
	if _, ok := k.(*Injector); !ok || !strings.Contains(why, "cpu") || onGPU {
		t.Fatalf("no GPU: got %T (%q), want the CPU Injector", k, why)
	}
	k.Close()

	g := &fakeGPU{err: errors.New("no driver")}
	k, why, onGPU = NewKernel(g, 3, Config{Workers: 1})
	if _, ok := k.(*Injector); !ok || !strings.Contains(why, "no driver") || g.device != 3 || onGPU {
		t.Fatalf("GPU that does not answer: got %T (%q) on device %d, want the CPU Injector and the reason", k, why, g.device)
	}
	k.Close()

	g = &fakeGPU{}
	k, why, onGPU = NewKernel(g, 1, Config{Workers: 1})
	if k != Kernel(g.k) || why != "fake gpu" || g.device != 1 || !onGPU {
		t.Fatalf("answering GPU: got %T (%q) on device %d, want its kernel", k, why, g.device)
	}
	k.Close()
	if err := k.Inject(context.Background(), &Job{}); !errors.Is(err, ErrInvalidJob) && !errors.Is(err, ErrClosed) {
		t.Fatalf("closed kernel: %v", err)
	}
}
