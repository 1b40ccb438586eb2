package node

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/meta"
)

// peerService serves api.Peer, the calls members make to each other:
// replica writes and reads, digests, forwarded raft commands, direct
// deletes and gossip key changes.
type peerService struct {
	api.UnimplementedPeerServer
	n *Node
}

func (s *peerService) Replicate(st grpc.ClientStreamingServer[api.PutFrame, api.PutResponse]) error {
	return s.n.receiveReplica(st)
}

func (s *peerService) Fetch(req *api.GetRequest, st grpc.ServerStreamingServer[api.GetFrame]) error {
	return s.n.serveGet(req, st, true)
}

func (s *peerService) FetchMany(req *api.FetchManyRequest, st grpc.ServerStreamingServer[api.FetchManyFrame]) error {
	return s.n.serveFetchMany(req, st)
}

func (s *peerService) Digest(ctx context.Context, req *api.DigestRequest) (*api.DigestResponse, error) {
	if req.From == "" && len(req.Keys) == 0 {
		// Nothing asked (a probe of the peer API): nothing answered.
		return &api.DigestResponse{Epoch: s.n.meta.Ring().Epoch()}, nil
	}
	return s.n.serveDigest(ctx, req)
}

func (s *peerService) MetaApply(ctx context.Context, req *api.MetaApplyRequest) (*api.MetaApplyResponse, error) {
	if err := s.n.sec.checkForwarded(ctx, req.Command); err != nil {
		return nil, err
	}
	if err := s.n.meta.ApplyForwarded(ctx, req.Command); err != nil {
		return nil, metaApplyStatus(err)
	}
	return &api.MetaApplyResponse{}, nil
}

// metaApplyStatus is the answer to a forwarded command that failed: a
// conditional settings change whose version no longer holds is Aborted
// (as a stale ring epoch is), carrying meta.ErrSettingsVersion's text,
// which the forwarder maps back to the sentinel; anything else goes
// through toStatus. Not FailedPrecondition, which the forwarder reads as
// "not the leader" and retries.
func metaApplyStatus(err error) error {
	if errors.Is(err, meta.ErrSettingsVersion) {
		return status.Error(codes.Aborted, err.Error())
	}
	return err
}

// GossipKey is the per-node step of Admin.GossipKeys.
func (s *peerService) GossipKey(_ context.Context, req *api.GossipKeyRequest) (*api.GossipKeyNodeResult, error) {
	return s.n.gossipKeyLocal(req.Op, req.Key)
}

// Delete removes an entry here only (replication's deletes and
// tombstones).
func (s *peerService) Delete(ctx context.Context, req *api.DeleteRequest) (*api.DeleteResponse, error) {
	key, err := api.KeyFromProto(req.GetKey())
	if err != nil {
		return nil, invalid(err)
	}
	if err := s.n.repl.ServeDelete(ctx, key, req.At); err != nil {
		return nil, replToStatus(err)
	}
	return &api.DeleteResponse{Deleted: 1}, nil
}
