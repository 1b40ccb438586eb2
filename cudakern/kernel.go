package cudakern

import (
	"context"
	"sync"
)

// Kernel is what callers of an injector use: the CPU Injector and the CUDA
// one (package cudakern/gpu, built with the cuda tag) both have these
// methods, with the same bits.
type Kernel interface {
	// Inject is Injector.Inject.
	Inject(ctx context.Context, j *Job) error
	// Workers is the number of jobs' worth of parallelism inside one call.
	Workers() int
	// Close stops the kernel; later calls return ErrClosed.
	Close()
}

var (
	deviceMu   sync.Mutex
	deviceOpen func() (Kernel, string, error)
)

// RegisterDevice sets how New opens a device kernel. cudakern/gpu calls it
// when it is linked (the cuda build tag); nothing else should.
func RegisterDevice(open func() (Kernel, string, error)) {
	deviceMu.Lock()
	defer deviceMu.Unlock()
	deviceOpen = open
}

// New returns the device kernel when one is registered and its device
// answers, else a CPU Injector of cfg, and says which it chose (the
// device's name, or why not, for the log).
func New(cfg Config) (Kernel, string) {
	deviceMu.Lock()
	open := deviceOpen
	deviceMu.Unlock()
	if open == nil {
		return NewInjector(cfg), "cpu (built without the cuda tag)"
	}
	k, name, err := open()
	if err != nil {
		return NewInjector(cfg), "cpu (no device: " + err.Error() + ")"
	}
	return k, name
}
