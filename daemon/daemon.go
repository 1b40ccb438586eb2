package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/internal/buildinfo"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/respserver"
)

// startTimeout bounds Node.Start: binding, opening the store and the
// metadata, joining gossip.
const startTimeout = time.Minute

// Run is kvmeshd: it parses args (flags and an optional -config file),
// starts a node, prints
//
//	kvmeshd listening node=ID grpc=HOST:PORT gossip=HOST:PORT raft=HOST:PORT http=HOST:PORT [resp=HOST:PORT]
//
// to stdout once everything listens, and the same line starting with
// "kvmeshd ready" once the node is ready (Node.Ready: in the ring, its
// metadata caught up with the leader's, its startup pull finished), and
// serves until ctx ends (the caller cancels it on SIGTERM) or a drain has
// taken the node out of the cluster (node.Node.Left), then shuts down
// cleanly and returns nil. Logs go to stderr. -h prints the flags to
// stderr and returns flag.ErrHelp; `version` prints the build
// (internal/buildinfo) and returns. Errors in the command line wrap
// ErrUsage; ExitCode maps every error to the process's exit status.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 1 && (args[0] == "version" || args[0] == "-version" || args[0] == "--version") {
		fmt.Fprintln(stdout, "kvmeshd", buildinfo.Read())
		return nil
	}
	fc, err := parseArgs(args, stderr)
	if err != nil {
		return err
	}
	cfg, err := fc.Config(stderr)
	if err != nil {
		return err
	}
	audit, closeAudit, err := fc.openAuditLog(stderr)
	if err != nil {
		return err
	}
	defer func() { _ = closeAudit() }()
	cfg.AuditLogger = audit
	tokens, err := fc.tokenRecords()
	if err != nil {
		return err
	}
	n, err := node.New(cfg)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, startTimeout)
	err = n.Start(sctx)
	cancel()
	if err != nil {
		return err
	}
	// A drain that took the node out of the cluster ends the process as
	// a signal would: there is nothing left for it to serve.
	parent := ctx
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		select {
		case <-n.Left():
			stop()
		case <-ctx.Done():
		}
	}()
	addrs := fmt.Sprintf("node=%s grpc=%s gossip=%s raft=%s http=%s", n.ID(), n.GRPCAddr(), n.GossipAddr(), n.RaftAddr(), n.HTTPAddr())
	respStopped := func() {}
	if fc.RESP != "" {
		addr, wait, err := serveRESP(ctx, n, fc.RESP, cfg.Logger)
		if err != nil {
			stop()
			return errors.Join(err, n.Close())
		}
		respStopped = wait
		addrs += " resp=" + addr
	}
	fmt.Fprintln(stdout, "kvmeshd listening", addrs)
	announced := make(chan struct{})
	go func() {
		defer close(announced)
		if waitReady(ctx, n) {
			fmt.Fprintln(stdout, "kvmeshd ready", addrs)
		}
	}()
	defer func() { <-announced }()
	if !cfg.Insecure {
		// Without TLS there is nothing to reload, and SIGHUP keeps its
		// default action.
		reloaded := make(chan struct{})
		go func() { defer close(reloaded); n.ReloadTLSOnSignal(ctx) }()
		defer func() { <-reloaded }()
	}
	rpcTimeout := cfg.RPCTimeout
	if rpcTimeout <= 0 {
		rpcTimeout = node.DefaultRPCTimeout
	}
	storeTokens(ctx, n, tokens, rpcTimeout, cfg.Logger)
	<-ctx.Done()
	if parent.Err() == nil {
		cfg.Logger.Info("kvmeshd: drained and left the cluster; shutting down", "node", n.ID())
	} else {
		cfg.Logger.Info("kvmeshd: shutting down", "node", n.ID())
	}
	// The door's commands use the node: they end first.
	respStopped()
	return n.Close()
}

// serveRESP serves the node's Redis-protocol door on addr until ctx ends;
// wait returns once it has stopped. It returns the address it listens on.
func serveRESP(ctx context.Context, n *node.Node, addr string, log *slog.Logger) (string, func(), error) {
	srv, err := respserver.New(n.RESPConfig())
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("kvmeshd: -resp: %w", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ctx, ln); err != nil {
			log.Error("kvmeshd: the RESP listener failed", "addr", addr, "err", err)
		}
	}()
	return ln.Addr().String(), func() { <-done }, nil
}

// Exit codes of kvmeshd (ExitCode).
const (
	// ExitOK: a clean shutdown on SIGTERM or SIGINT, a drained node that
	// left the cluster, -h, version.
	ExitOK = 0
	// ExitError: the node could not start or failed.
	ExitError = 1
	// ExitUsage: a bad command line (ErrUsage).
	ExitUsage = 2
	// ExitLeft: the data directory belongs to a node that left the
	// cluster (node.ErrLeftCluster). Starting again will not change that,
	// so a supervisor should not retry: systemd's
	// RestartPreventExitStatus=3 says so.
	ExitLeft = 3
)

// ExitCode is the exit status of kvmeshd for Run's error.
func ExitCode(err error) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return ExitOK
	case errors.Is(err, ErrUsage):
		return ExitUsage
	case errors.Is(err, node.ErrLeftCluster):
		return ExitLeft
	}
	return ExitError
}

// readyPoll is how often waitReady checks the node.
const readyPoll = 100 * time.Millisecond

// waitReady blocks until n is ready (true) or ctx ends (false).
func waitReady(ctx context.Context, n *node.Node) bool {
	t := time.NewTicker(readyPoll)
	defer t.Stop()
	for n.Ready() != nil {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	return true
}

// storeTokens puts the tokens file's records into the cluster metadata
// once the node serves, retrying each until the cluster has a leader or
// ctx ends (writing a record again is idempotent).
func storeTokens(ctx context.Context, n *node.Node, recs []auth.Record, timeout time.Duration, log *slog.Logger) {
	for _, rec := range recs {
		for {
			wctx, cancel := context.WithTimeout(ctx, timeout)
			err := n.Meta().PutToken(wctx, rec)
			cancel()
			if err == nil {
				log.Info("kvmeshd: token record stored", "node", n.ID(), "id", rec.ID, "name", rec.Name, "scopes", rec.Scopes.String())
				break
			}
			log.Debug("kvmeshd: storing token record", "node", n.ID(), "id", rec.ID, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
}
