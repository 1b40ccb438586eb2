// Package client is the Go client of a kvmesh cluster. It dials any seed,
// learns the ring (members and epoch) with ClusterInfo, and sends each
// request straight to a replica of the chunk's content ID, failing over to
// the next replica on Unavailable and retrying with backoff within the
// caller's deadline. Lookups are batched per replica set. Every answer
// carries the epoch of the node that gave it; a newer epoch makes the
// client refresh its ring.
package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/ring"
)

// Errors callers branch on. gRPC status codes pass through otherwise.
var (
	// ErrNoNodes: no seed or member answered.
	ErrNoNodes = errors.New("client: no cluster node answered")
	// ErrNotFound: the key is stored on no replica.
	ErrNotFound = errors.New("client: not found")
	// ErrNoCUDAIPC: the node cannot open a cache's CUDA IPC handles
	// (RegisterCache with CacheRegistration.CUDA): it has no device
	// kernel (a kvmeshd built without the cuda tag: Unimplemented) or its
	// device refused them (InvalidArgument). The cache can be served
	// through shared memory instead (CacheRegistration.File), which the
	// caller copies to its GPU itself; see RegisterCache.
	ErrNoCUDAIPC = errors.New("client: the node cannot open CUDA IPC memory")
)

// Client is safe for concurrent use. Close it when done.
type Client struct {
	cfg  Config
	log  *slog.Logger
	dial []grpc.DialOption // DialOptions(cfg)

	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	closed bool

	view       atomic.Pointer[view]
	refreshing atomic.Bool
	bg         sync.WaitGroup
	bgCtx      context.Context
	bgCancel   context.CancelFunc
}

// view is the client's picture of the cluster.
type view struct {
	ring *ring.Ring
	info *api.ClusterInfoResponse
	rf   int
}

// New dials the seeds and fetches the cluster's ring; it fails if no seed
// answers before ctx ends.
func New(ctx context.Context, cfg Config) (*Client, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	dial, err := DialOptions(cfg)
	if err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, log: cfg.Logger, dial: dial, conns: make(map[string]*grpc.ClientConn)}
	c.bgCtx, c.bgCancel = context.WithCancel(context.Background())
	c.view.Store(&view{ring: ring.New(0, nil), info: &api.ClusterInfoResponse{}, rf: 1})
	if err := c.Refresh(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Close closes every connection.
func (c *Client) Close() error {
	c.bgCancel()
	c.bg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for _, cc := range c.conns {
		_ = cc.Close()
	}
	c.conns = nil
	return nil
}

func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("client: closed")
	}
	if cc := c.conns[addr]; cc != nil {
		return cc, nil
	}
	cc, err := grpc.NewClient(addr, c.dial...)
	if err != nil {
		return nil, fmt.Errorf("client: %s: %w", addr, err)
	}
	c.conns[addr] = cc
	return cc, nil
}

// Ring is the ring the client routes with.
func (c *Client) Ring() *ring.Ring { return c.view.Load().ring }

// ReplicationFactor is R as the cluster last told.
func (c *Client) ReplicationFactor() int { return c.view.Load().rf }

// Codec is the codec the cluster stores new entries in, as it last told
// (raw if it did not say). A node stores an entry in this codec whatever
// codec it came in; encoding with it spares the node that work.
func (c *Client) Codec() chunk.Codec {
	codec, err := chunk.ParseCodec(c.view.Load().info.GetCodec())
	if err != nil {
		return chunk.CodecRaw
	}
	return codec
}
