package cudakern

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// fakeDevice is a registered device kernel that records its use.
type fakeDevice struct {
	*Injector
	opened bool
}

func TestNewChoosesDevice(t *testing.T) {
	defer RegisterDevice(nil)
	k, why := New(Config{Workers: 1})
	if _, ok := k.(*Injector); !ok || !strings.Contains(why, "cpu") {
		t.Fatalf("no device registered: got %T (%q), want the CPU Injector", k, why)
	}
	k.Close()

	RegisterDevice(func() (Kernel, string, error) { return nil, "", errors.New("no driver") })
	k, why = New(Config{Workers: 1})
	if _, ok := k.(*Injector); !ok || !strings.Contains(why, "no driver") {
		t.Fatalf("device that does not answer: got %T (%q), want the CPU Injector and the reason", k, why)
	}
	k.Close()

	dev := &fakeDevice{Injector: NewInjector(Config{Workers: 1})}
	RegisterDevice(func() (Kernel, string, error) { dev.opened = true; return dev, "fake gpu", nil })
	k, why = New(Config{Workers: 1})
	if k != Kernel(dev) || why != "fake gpu" || !dev.opened {
		t.Fatalf("answering device: got %T (%q), want the device kernel", k, why)
	}
	k.Close()
	if err := k.Inject(context.Background(), &Job{}); !errors.Is(err, ErrInvalidJob) && !errors.Is(err, ErrClosed) {
		t.Fatalf("closed kernel: %v", err)
	}
}
