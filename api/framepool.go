package api

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc/mem"
)

// framePool is the gRPC buffer pool of kvmesh's connections: power-of-two
// size classes, 256 B to 4 MiB, and buffers handed out as they were left.
// gRPC's default pool clears every buffer it hands out, which on a tensor
// stream is a pass over every received byte (a tenth of a Get's client CPU
// in a profile) for nothing: gRPC fills each buffer it gets (a frame read
// to its length, a message marshalled into it) before anything reads it.
type framePool struct {
	classes [framePoolClasses]sync.Pool
}

const (
	framePoolMinShift = 8
	framePoolClasses  = 15 // up to 4 MiB
)

// newFramePool returns an empty framePool.
func newFramePool() mem.BufferPool { return &framePool{} }

// framePoolClass is the class of a buffer of n bytes (n > 0).
func framePoolClass(n int) int {
	if n <= 1<<framePoolMinShift {
		return 0
	}
	return bits.Len(uint(n-1)) - framePoolMinShift
}

func (p *framePool) Get(length int) *[]byte {
	c := framePoolClass(length)
	if c >= framePoolClasses {
		b := make([]byte, length)
		return &b
	}
	if b, ok := p.classes[c].Get().(*[]byte); ok {
		*b = (*b)[:length]
		return b
	}
	b := make([]byte, length, 1<<(framePoolMinShift+c))
	return &b
}

// Put keeps buffers of a class's exact capacity; others are dropped.
func (p *framePool) Put(b *[]byte) {
	n := cap(*b)
	if n == 0 {
		return
	}
	c := framePoolClass(n)
	if c < framePoolClasses && n == 1<<(framePoolMinShift+c) {
		*b = (*b)[:0]
		p.classes[c].Put(b)
	}
}
