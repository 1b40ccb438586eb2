package meta

import (
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/kvmesh/kvmesh/tlsconf"
)

// raftNode is a raft NetworkTransport over a streamLayer whose consumer
// acknowledges every AppendEntries and counts them.
type raftNode struct {
	trans *raft.NetworkTransport
	mu    sync.Mutex
	got   []raft.AppendEntriesRequest
	done  chan struct{}
}

func newRaftNode(t *testing.T, tl *tlsconf.TLS) *raftNode {
	t.Helper()
	sl, err := newStreamLayer("127.0.0.1:0", nil, tl)
	if err != nil {
		t.Fatal(err)
	}
	n := &raftNode{
		trans: raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
			Stream: sl, MaxPool: 2, Timeout: 5 * time.Second, Logger: hclog.NewNullLogger(),
		}),
		done: make(chan struct{}),
	}
	stop := make(chan struct{})
	go func() {
		defer close(n.done)
		for {
			select {
			case <-stop:
				return
			case rpc := <-n.trans.Consumer():
				req, ok := rpc.Command.(*raft.AppendEntriesRequest)
				if !ok {
					rpc.Respond(nil, raft.ErrUnsupportedProtocol)
					continue
				}
				n.mu.Lock()
				n.got = append(n.got, *req)
				n.mu.Unlock()
				rpc.Respond(&raft.AppendEntriesResponse{Term: req.Term, LastLog: req.PrevLogEntry + uint64(len(req.Entries)), Success: true}, nil)
			}
		}
	}()
	t.Cleanup(func() {
		// Close leaves the pooled outgoing connections open, and the
		// peer's reader of each one with them.
		n.trans.CloseStreams()
		_ = n.trans.Close()
		close(stop)
		<-n.done
	})
	return n
}

func (n *raftNode) received() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.got)
}

func appendTo(from, to *raftNode) error {
	req := &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("from"), Addr: []byte(from.trans.LocalAddr())},
		Term:      3,
		Entries:   []*raft.Log{{Index: 1, Term: 3, Type: raft.LogCommand, Data: []byte("model registry entry")}},
	}
	var resp raft.AppendEntriesResponse
	if err := from.trans.AppendEntries("to", to.trans.LocalAddr(), req, &resp); err != nil {
		return err
	}
	if !resp.Success || resp.LastLog != 1 {
		return errBadResponse
	}
	return nil
}

var errBadResponse = errors.New("unexpected AppendEntries response")

// TestRaftStreamLayer: two nodes of the cluster CA exchange raft RPCs; a
// node of another CA, a client certificate of the cluster and plaintext
// get none through in either direction. (A certificate that tlsconf.New
// refuses to load, expired or not of the CA it trusts, is refused by the
// same node configurations: tlsconf's TestNodeLink.)
func TestRaftStreamLayer(t *testing.T) {
	good := newTestPKI(t, "cluster")
	evil := newTestPKI(t, "evil")
	n1 := newRaftNode(t, good.tls("n1", tlsconf.UsageNode))
	n2 := newRaftNode(t, good.tls("n2", tlsconf.UsageNode))

	if err := appendTo(n1, n2); err != nil {
		t.Fatalf("n1 -> n2: %v", err)
	}
	if err := appendTo(n2, n1); err != nil {
		t.Fatalf("n2 -> n1: %v", err)
	}
	if n2.received() != 1 || n1.received() != 1 {
		t.Fatalf("received %d, %d", n1.received(), n2.received())
	}

	plain, err := tlsconf.New(tlsconf.Config{Insecure: true, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	intruders := []struct {
		name string
		tl   *tlsconf.TLS
	}{
		// Trusts its own CA: refuses n2 and is refused.
		{"node of another CA", evil.tls("x1", tlsconf.UsageNode)},
		// A valid client certificate of the cluster is not a node.
		{"client cert of the cluster", good.tls("alice", tlsconf.UsageClient)},
		{"plaintext", plain},
	}
	for _, in := range intruders {
		t.Run(in.name, func(t *testing.T) {
			x := newRaftNode(t, in.tl)
			if err := appendTo(x, n2); err == nil {
				t.Fatal("intruder's AppendEntries accepted")
			}
			if err := appendTo(n2, x); err == nil {
				t.Fatal("n2 talked to the intruder")
			}
			if x.received() != 0 {
				t.Fatal("intruder received an entry")
			}
		})
	}
	if n2.received() != 1 {
		t.Fatalf("n2 received %d entries, want 1", n2.received())
	}
}

func TestStreamLayerAddr(t *testing.T) {
	tl, err := tlsconf.New(tlsconf.Config{Insecure: true, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newStreamLayer("0.0.0.0:0", nil, tl); err == nil {
		t.Fatal("unspecified advertise address accepted")
	}
	adv := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7000}
	sl, err := newStreamLayer("127.0.0.1:0", adv, tl)
	if err != nil {
		t.Fatal(err)
	}
	defer sl.Close()
	if sl.Addr().String() != adv.String() {
		t.Fatalf("Addr %v, want %v", sl.Addr(), adv)
	}
	if _, err := sl.Dial("no-port", time.Second); err == nil {
		t.Fatal("dialed an address without a port")
	}
}

// TestStreamLayerSilentPeer: an accepted connection whose peer leaves
// before the handshake fails raft's reads and writes with the handshake
// error (a peer that stays silent fails the same way after
// raftHandshakeTimeout; the test does not wait for that).
func TestStreamLayerSilentPeer(t *testing.T) {
	p := newTestPKI(t, "cluster")
	sl, err := newStreamLayer("127.0.0.1:0", nil, p.tls("n1", tlsconf.UsageNode))
	if err != nil {
		t.Fatal(err)
	}
	defer sl.Close()
	raw, err := net.Dial("tcp", sl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := sl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = raw.Close()
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("read from a peer that never handshook")
	}
	if _, err := c.Write([]byte("x")); err == nil {
		t.Fatal("wrote to a peer that never handshook")
	}
}
