package node

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/auth"
)

// clientService serves api.Client, the calls applications and the CLI
// make. The Put and Get bodies it shares with peerService are in
// putget.go; Lookup's fan-out across replicas is in lookup.go.
type clientService struct {
	api.UnimplementedClientServer
	n *Node
}

func (s *clientService) RegisterModel(ctx context.Context, req *api.RegisterModelRequest) (*api.RegisterModelResponse, error) {
	spec, err := api.SpecFromProto(req.GetSpec())
	if err != nil {
		return nil, invalid(err)
	}
	if err := checkFingerprint(ctx, spec.Fingerprint()); err != nil {
		return nil, err
	}
	fp, err := s.n.meta.RegisterModel(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &api.RegisterModelResponse{Fingerprint: api.ProtoFingerprint(fp)}, nil
}

// Models lists the registered models the caller may touch: a token with
// a namespace sees only the models inside it, so one tenant does not
// learn another's models.
func (s *clientService) Models(ctx context.Context, _ *api.ModelsRequest) (*api.ModelsResponse, error) {
	resp := &api.ModelsResponse{}
	for _, spec := range s.n.meta.Models() {
		if checkFingerprint(ctx, spec.Fingerprint()) != nil {
			continue
		}
		resp.Models = append(resp.Models, &api.ModelInfo{Fingerprint: api.ProtoFingerprint(spec.Fingerprint()), Spec: api.ProtoSpec(spec)})
	}
	return resp, nil
}

func (s *clientService) Put(st grpc.ClientStreamingServer[api.PutFrame, api.PutResponse]) error {
	return s.n.receivePut(st)
}

func (s *clientService) Get(req *api.GetRequest, st grpc.ServerStreamingServer[api.GetFrame]) error {
	return s.n.serveGet(req, st, req.GetDirect())
}

func (s *clientService) Lookup(ctx context.Context, req *api.LookupRequest) (*api.LookupResponse, error) {
	return s.n.lookup(ctx, req)
}

func (s *clientService) Delete(ctx context.Context, req *api.DeleteRequest) (*api.DeleteResponse, error) {
	n := s.n
	key, err := api.KeyFromProto(req.GetKey())
	if err != nil {
		return nil, invalid(err)
	}
	if err := checkFingerprint(ctx, key.Fingerprint); err != nil {
		return nil, err
	}
	if req.Direct || req.At != 0 {
		// A delete here only, at a chosen time, is replication's
		// (Peer.Delete; older members send it here): a client could
		// otherwise plant tombstones dated in the future.
		if err := n.sec.checkPeer(ctx, "a direct delete"); err != nil {
			return nil, err
		}
	}
	if req.Direct {
		if err := n.repl.ServeDelete(ctx, key, req.At); err != nil {
			return nil, replToStatus(err)
		}
		return &api.DeleteResponse{Deleted: 1}, nil
	}
	res, err := n.repl.Delete(ctx, key)
	if err != nil {
		return nil, err
	}
	return &api.DeleteResponse{Deleted: uint32(len(res.DeletedOn))}, nil
}

func (s *clientService) Stats(ctx context.Context, _ *api.StatsRequest) (*api.StatsResponse, error) {
	_ = grpc.SetHeader(ctx, metadata.Pairs(api.StateHeader, s.n.State()))
	if p, ok := auth.FromContext(ctx); !ok || len(p.Namespace) > 0 {
		// The counts are the whole node's, every tenant's together: a
		// caller confined to a namespace learns only the node's ID.
		return &api.StatsResponse{NodeId: s.n.cfg.NodeID}, nil
	}
	st := s.n.store.Stats()
	resp := &api.StatsResponse{NodeId: s.n.cfg.NodeID, Entries: uint64(st.Entries), Panics: uint64(readCounter(s.n.metrics.panics))}
	for _, t := range st.Tiers {
		if !t.Enabled {
			continue
		}
		resp.Bytes += uint64(t.StoredBytes)
		resp.Tiers = append(resp.Tiers, &api.TierStats{Name: t.Tier.String(), Entries: uint64(t.Entries), Bytes: uint64(t.StoredBytes),
			CapacityBytes: uint64(t.Budget), Evictions: t.Evictions})
	}
	resp.Forwarded = uint64(readCounter(s.n.metrics.forwards))
	return resp, nil
}

func (s *clientService) ClusterInfo(ctx context.Context, _ *api.ClusterInfoRequest) (*api.ClusterInfoResponse, error) {
	n := s.n
	r := n.meta.Ring()
	set := n.meta.Settings()
	lid, laddr := n.meta.Leader()
	resp := &api.ClusterInfoResponse{NodeId: n.cfg.NodeID, Epoch: r.Epoch(), LeaderId: lid, LeaderGrpcAddr: laddr,
		ReplicationFactor: uint32(set.ReplicationFactor), WriteQuorum: uint32(set.WriteQuorum), Codec: set.Codec.String()}
	http := make(map[string]string)
	if n.gossip != nil {
		for _, m := range n.gossip.Members() {
			http[m.ID] = m.HTTPAddr
		}
	}
	for _, m := range r.Members() {
		pm := api.ProtoMember(m)
		pm.HttpAddr = http[m.ID]
		resp.Members = append(resp.Members, pm)
	}
	return resp, nil
}

func (s *clientService) Drain(req *api.DrainRequest, st grpc.ServerStreamingServer[api.DrainProgress]) error {
	var sendErr error
	_, err := s.n.Drain(st.Context(), req.KeepMembership, func(p *api.DrainProgress) {
		if sendErr == nil {
			sendErr = st.Send(p)
		}
	})
	if err != nil {
		return toStatus(err)
	}
	return toStatus(sendErr)
}
