package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/linkpace"
	"github.com/kvmesh/kvmesh/meta"
)

// peerPool keeps one gRPC connection per peer address. Connections are
// lazy (grpc.NewClient does not dial) and reconnect by themselves.
type peerPool struct {
	log    *slog.Logger
	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	closed bool
	// creds dial peers (node certificate over mutual TLS); nil means
	// plaintext.
	creds credentials.TransportCredentials
	// linkRate paces every connection (Config.PeerLinkBytesPerSec), both
	// directions, to emulate a slower network. Each node paces only the
	// connections it dials (one per peer), so every direction of every
	// node pair crosses exactly one pacer.
	linkRate int64
}

func newPeerPool(log *slog.Logger) *peerPool {
	return &peerPool{log: log, conns: make(map[string]*grpc.ClientConn)}
}

var errPoolClosed = errors.New("node: peer pool closed")

func (p *peerPool) conn(addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errPoolClosed
	}
	if c := p.conns[addr]; c != nil {
		return c, nil
	}
	creds := p.creds
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	c, err := grpc.NewClient(addr, append(api.DialOptions(),
		grpc.WithContextDialer(linkpace.Dialer(p.linkRate)),
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(api.Codec()), grpc.MaxCallRecvMsgSize(8<<20)),
	)...)
	if err != nil {
		return nil, fmt.Errorf("node: peer %s: %w", addr, err)
	}
	p.conns[addr] = c
	return c, nil
}

func (p *peerPool) peer(addr string) (api.PeerClient, error) {
	c, err := p.conn(addr)
	if err != nil {
		return nil, err
	}
	return api.NewPeerClient(c), nil
}

func (p *peerPool) client(addr string) (api.ClientClient, error) {
	c, err := p.conn(addr)
	if err != nil {
		return nil, err
	}
	return api.NewClientClient(c), nil
}

func (p *peerPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for addr, c := range p.conns {
		if err := c.Close(); err != nil {
			p.log.Debug("node: close peer connection", "addr", addr, "err", err)
		}
	}
	p.conns = nil
}

// withTimeout bounds an outgoing call by the node's RPC timeout unless ctx
// ends sooner.
func (n *Node) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, n.cfg.RPCTimeout)
}

// forwarder implements meta.Forwarder over Peer.MetaApply.
type forwarder struct{ n *Node }

func (f forwarder) Apply(ctx context.Context, leaderGRPCAddr string, cmd []byte) error {
	pc, err := f.n.peers.peer(leaderGRPCAddr)
	if err != nil {
		return err
	}
	ctx, cancel := f.n.withTimeout(ctx)
	defer cancel()
	_, err = pc.MetaApply(ctx, &api.MetaApplyRequest{Command: cmd})
	if err == nil {
		return nil
	}
	// Map the leader's answer back to meta's sentinels, so meta retries
	// what it should and stops on what it should not.
	st := status.Convert(err)
	switch st.Code() {
	case codes.InvalidArgument:
		return fmt.Errorf("%w: %s", meta.ErrInvalidCommand, st.Message())
	case codes.Aborted:
		// Two conditional writes fail Aborted (metaApplyStatus); the
		// sentinel's text in the message tells them apart.
		if strings.Contains(st.Message(), meta.ErrSettingsVersion.Error()) {
			return fmt.Errorf("%w: %s", meta.ErrSettingsVersion, st.Message())
		}
		return fmt.Errorf("%w: %s", meta.ErrStaleEpoch, st.Message())
	case codes.FailedPrecondition:
		return fmt.Errorf("%w: %s", meta.ErrNotLeader, st.Message())
	}
	return fmt.Errorf("node: forward to leader %s: %w", leaderGRPCAddr, err)
}

// fetchEntry reads the whole entry of key from addr with Peer.Fetch.
func (n *Node) fetchEntry(ctx context.Context, addr string, key chunk.Key) ([]byte, error) {
	pc, err := n.peers.peer(addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := n.withTimeout(ctx)
	defer cancel()
	st, err := pc.Fetch(ctx, &api.GetRequest{Key: api.ProtoKey(key), Format: api.Format_FORMAT_ENTRY, Direct: true})
	if err != nil {
		return nil, err
	}
	var hdr api.GetHeader
	if err := api.RecvHeader(st, &hdr); err != nil {
		return nil, err
	}
	if hdr.TotalBytes > uint64(n.cfg.Limits.MaxBlobBytes) {
		return nil, fmt.Errorf("node: fetched entry of %d bytes exceeds limits", hdr.TotalBytes)
	}
	blob := make([]byte, hdr.TotalBytes)
	if err := api.RecvBody(st, blob); err != nil {
		return nil, err
	}
	n.metrics.bytesIn.WithLabelValues("fetch").Add(float64(len(blob)))
	return blob, nil
}
