package workload

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/kvtier"
	"github.com/kvmesh/kvmesh/node"
)

// LocalConfig configures StartLocal. Zero fields take the defaults shown.
type LocalConfig struct {
	Nodes     int   // 3
	DRAMBytes int64 // DRAM tier of each node; 512 MiB
	// Admission is the nodes' admission policy; kvtier.AdmitAll.
	Admission kvtier.Admission
	// Dir holds the nodes' data; empty means a new temporary directory,
	// removed by Close.
	Dir string
	// Logger receives the nodes' and client's logs; nil discards them.
	Logger *slog.Logger
}

// Local is an in-process cluster of real nodes on loopback and a client
// connected to it.
type Local struct {
	Nodes  []*node.Node
	Client *client.Client
	tmp    string
}

// StartLocal starts cfg.Nodes nodes that bootstrap together, waits until
// every one is ready and sees all of them in its ring, and connects a
// client.
func StartLocal(ctx context.Context, cfg LocalConfig) (_ *Local, err error) {
	if cfg.Nodes <= 0 {
		cfg.Nodes = 3
	}
	if cfg.DRAMBytes <= 0 {
		cfg.DRAMBytes = 512 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = discardLogger()
	}
	l := &Local{}
	if cfg.Dir == "" {
		if l.tmp, err = os.MkdirTemp("", "kvmesh-workload-"); err != nil {
			return nil, err
		}
		cfg.Dir = l.tmp
	}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	var seeds []string
	for i := range cfg.Nodes {
		n, err := node.New(node.Config{
			NodeID: fmt.Sprintf("n%d", i+1), DataDir: filepath.Join(cfg.Dir, fmt.Sprintf("n%d", i+1)),
			Seeds: seeds, BootstrapExpect: cfg.Nodes, DRAMBytes: cfg.DRAMBytes, Admission: cfg.Admission, LocalTiming: true,
			HTTPAddr: "off", Logger: cfg.Logger,
			// Loopback only, in one process: no TLS to configure.
			Insecure: true,
		})
		if err != nil {
			return nil, err
		}
		if err := n.Start(ctx); err != nil {
			_ = n.Close()
			return nil, fmt.Errorf("workload: start node %d: %w", i+1, err)
		}
		l.Nodes = append(l.Nodes, n)
		if i == 0 {
			seeds = []string{n.GossipAddr()}
		}
	}
	for {
		ready := true
		for _, n := range l.Nodes {
			if n.Ready() != nil || n.Meta().Ring().Len() != cfg.Nodes {
				ready = false
			}
		}
		if ready {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("workload: cluster not ready: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	seedAddrs := make([]string, len(l.Nodes))
	for i, n := range l.Nodes {
		seedAddrs[i] = n.GRPCAddr()
	}
	if l.Client, err = client.New(ctx, client.Config{Seeds: seedAddrs, Logger: cfg.Logger}); err != nil {
		return nil, err
	}
	return l, nil
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// Close stops the client and every node and removes a temporary data
// directory.
func (l *Local) Close() error {
	var errs []error
	if l.Client != nil {
		errs = append(errs, l.Client.Close())
	}
	for _, n := range l.Nodes {
		errs = append(errs, n.Close())
	}
	if l.tmp != "" {
		errs = append(errs, os.RemoveAll(l.tmp))
	}
	return errors.Join(errs...)
}
