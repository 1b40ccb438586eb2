package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/gossip/gossipkey"
)

// errKeyRefused wraps whatever a keyring refuses a rotation step with
// (a key not installed, the primary removed): the member's keyring is
// not in the state the step needs, FailedPrecondition (toStatus).
var errKeyRefused = errors.New("gossip keyring refused the change")

// keyFingerprint names a gossip key without revealing it.
func keyFingerprint(key []byte) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:8])
}

// gossipKeyLocal applies op to this node's gossip keyring and rewrites its
// keyring file, if it has one, so a restart comes back with what the
// cluster speaks.
func (n *Node) gossipKeyLocal(op api.GossipKeyOp, key []byte) (*api.GossipKeyNodeResult, error) {
	if n.gossip == nil {
		return nil, status.Error(codes.Unavailable, "gossip is not running")
	}
	n.sec.keyMu.Lock()
	defer n.sec.keyMu.Unlock()
	var err error
	switch op {
	case api.GossipKeyOp_GOSSIP_KEY_OP_LIST:
	case api.GossipKeyOp_GOSSIP_KEY_OP_INSTALL:
		err = n.gossip.InstallKey(key)
	case api.GossipKeyOp_GOSSIP_KEY_OP_USE:
		err = n.gossip.UseKey(key)
	case api.GossipKeyOp_GOSSIP_KEY_OP_REMOVE:
		err = n.gossip.RemoveKey(key)
	default:
		return nil, status.Errorf(codes.InvalidArgument, "gossip key operation %v", op)
	}
	if err != nil {
		return nil, toStatus(fmt.Errorf("%w: %w", errKeyRefused, err))
	}
	primary, all := n.gossip.Keys()
	if op != api.GossipKeyOp_GOSSIP_KEY_OP_LIST && n.cfg.GossipKeyringFile != "" && primary != nil {
		if err := writeKeyring(n.cfg.GossipKeyringFile, primary, all[1:]); err != nil {
			return nil, status.Errorf(codes.Internal, "keyring changed in memory but not in its file: %v", err)
		}
	}
	res := &api.GossipKeyNodeResult{NodeId: n.cfg.NodeID}
	if primary != nil {
		res.Primary = keyFingerprint(primary)
	}
	for _, k := range all {
		res.Keys = append(res.Keys, keyFingerprint(k))
	}
	return res, nil
}

// writeKeyring replaces the keyring file at path: a new file renamed over
// the old one, so a crash leaves either keyring whole.
func writeKeyring(path string, primary []byte, others [][]byte) error {
	tmp := path + ".new"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := gossipkey.WriteFile(tmp, primary, others...); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	// The rename is durable once the directory is synced.
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// gossipKeyAll runs op on every live member in parallel (this node
// locally), results sorted by node ID.
func (n *Node) gossipKeyAll(ctx context.Context, op api.GossipKeyOp, key []byte) *api.GossipKeysResponse {
	members := n.gossip.Members()
	out := make([]*api.GossipKeyNodeResult, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var res *api.GossipKeyNodeResult
			var err error
			if m.ID == n.cfg.NodeID {
				res, err = n.gossipKeyLocal(op, key)
			} else {
				res, err = n.remoteGossipKey(ctx, m.GRPCAddr, op, key)
			}
			if err != nil {
				res = &api.GossipKeyNodeResult{Error: status.Convert(err).Message()}
			}
			res.NodeId = m.ID
			out[i] = res
		}()
	}
	wg.Wait()
	resp := &api.GossipKeysResponse{Nodes: out}
	for _, r := range out {
		if r.Error != "" {
			resp.Failed++
		}
	}
	return resp
}

func (n *Node) remoteGossipKey(ctx context.Context, addr string, op api.GossipKeyOp, key []byte) (*api.GossipKeyNodeResult, error) {
	if addr == "" {
		return nil, errors.New("no gRPC address")
	}
	pc, err := n.peers.peer(addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := n.withTimeout(ctx)
	defer cancel()
	return pc.GossipKey(ctx, &api.GossipKeyRequest{Op: op, Key: key})
}
