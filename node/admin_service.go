package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/gossip/gossipkey"
	"github.com/kvmesh/kvmesh/meta"
)

// adminService is the Admin API: API tokens (records in the raft
// metadata), live gossip key rotation fanned out to every member, and the
// cluster settings (raft metadata). The
// Guard lets only admin-scoped callers in; the handlers add that a token
// never grants more than its creator holds.
type adminService struct {
	api.UnimplementedAdminServer
	n *Node
}

// caller is the authenticated principal of ctx; a call that bypassed the
// Guard is refused.
func caller(ctx context.Context) (*auth.Principal, error) {
	p, ok := auth.FromContext(ctx)
	if !ok {
		return nil, status.Error(codes.PermissionDenied, "no authenticated caller")
	}
	return p, nil
}

// tokenInfo describes rec without its salt and hash.
func tokenInfo(rec auth.Record) *api.TokenInfo {
	ti := &api.TokenInfo{Id: rec.ID, Name: rec.Name, Scopes: rec.Scopes.String(), Namespace: slices.Clone(rec.Namespace),
		Created: rec.Created.Unix()}
	if !rec.Expires.IsZero() {
		ti.Expires = rec.Expires.Unix()
	}
	return ti
}

// maxTokenTTL bounds CreateToken's lifetime (and keeps time arithmetic
// away from overflow).
const maxTokenTTL = 100 * 365 * 24 * time.Hour

// CreateToken makes a token, stores its record (salt and HMAC, never the
// secret) through raft and returns the token once.
func (s *adminService) CreateToken(ctx context.Context, req *api.CreateTokenRequest) (*api.CreateTokenResponse, error) {
	p, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(req.Scopes) == "" {
		return nil, status.Error(codes.InvalidArgument, "create token: no scopes (read, write, admin)")
	}
	scopes, err := auth.ParseScopes(req.Scopes)
	if err != nil {
		return nil, toStatus(err)
	}
	if req.TtlSeconds < 0 || time.Duration(req.TtlSeconds) > maxTokenTTL/time.Second {
		return nil, status.Errorf(codes.InvalidArgument, "create token: ttl of %d seconds", req.TtlSeconds)
	}
	if len(req.Name) > auth.MaxName {
		return nil, status.Errorf(codes.InvalidArgument, "create token: name longer than %d bytes", auth.MaxName)
	}
	if len(req.Namespace) > auth.MaxNamespace {
		return nil, status.Errorf(codes.InvalidArgument, "create token: more than %d namespace prefixes", auth.MaxNamespace)
	}
	ns, err := p.Grant(scopes, auth.Namespace(req.Namespace))
	if err != nil {
		return nil, toStatus(err)
	}
	var exp time.Time
	if req.TtlSeconds > 0 {
		exp = time.Now().Add(time.Duration(req.TtlSeconds) * time.Second).UTC()
	}
	tok, rec, err := auth.NewToken(req.Name, scopes, ns, exp)
	if err != nil {
		return nil, toStatus(err)
	}
	if err := s.n.meta.PutToken(ctx, rec); err != nil {
		return nil, toStatus(err)
	}
	s.n.log.Info("node: token created", "id", rec.ID, "name", rec.Name, "scopes", rec.Scopes.String(), "by", p.Key())
	return &api.CreateTokenResponse{Token: tok.String(), Info: tokenInfo(rec)}, nil
}

// ListTokens lists the tokens the caller manages (all of them for an
// admin without a namespace), without secrets.
func (s *adminService) ListTokens(ctx context.Context, _ *api.ListTokensRequest) (*api.ListTokensResponse, error) {
	p, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	resp := &api.ListTokensResponse{}
	for _, rec := range s.n.meta.Tokens() {
		if p.Manages(rec) {
			resp.Tokens = append(resp.Tokens, tokenInfo(rec))
		}
	}
	return resp, nil
}

// RevokeToken deletes a token's record through raft; every node refuses
// the token once it applies the delete (this one before the call
// returns).
func (s *adminService) RevokeToken(ctx context.Context, req *api.RevokeTokenRequest) (*api.RevokeTokenResponse, error) {
	p, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	rec, err := s.n.meta.LookupToken(ctx, req.Id)
	if len(p.Namespace) > 0 && (err != nil || !p.Manages(rec)) {
		// A token outside the caller's namespace gets the answer of one
		// that does not exist, so IDs cannot be probed for. Only an
		// unrestricted admin may delete what this node has not seen (it
		// may lag behind the put).
		return nil, status.Errorf(codes.NotFound, "no token %s", req.Id)
	}
	if err := s.n.meta.DeleteToken(ctx, req.Id); err != nil {
		return nil, toStatus(err)
	}
	s.n.log.Info("node: token revoked", "id", req.Id, "by", p.Key())
	return &api.RevokeTokenResponse{}, nil
}

// GossipKeys applies one rotation step on every live member. A step that
// changes keys first lists every member's keys and changes nothing (an
// Aborted status naming the members) if one does not answer or has no
// keyring, if USE names a key some member lacks, or if REMOVE names a key
// that is some member's primary: a rotation step is all or nothing as far
// as it can be checked.
// Failures while applying are per node in the answer (Failed > 0).
func (s *adminService) GossipKeys(ctx context.Context, req *api.GossipKeyRequest) (*api.GossipKeysResponse, error) {
	n := s.n
	if n.gossip == nil {
		return nil, status.Error(codes.Unavailable, "gossip is not running")
	}
	switch req.Op {
	case api.GossipKeyOp_GOSSIP_KEY_OP_LIST:
		return n.gossipKeyAll(ctx, req.Op, nil), nil
	case api.GossipKeyOp_GOSSIP_KEY_OP_INSTALL, api.GossipKeyOp_GOSSIP_KEY_OP_USE, api.GossipKeyOp_GOSSIP_KEY_OP_REMOVE:
	default:
		return nil, status.Errorf(codes.InvalidArgument, "gossip key operation %v", req.Op)
	}
	if _, err := gossipkey.Parse(gossipkey.Encode(req.Key)); err != nil {
		return nil, toStatus(err)
	}
	fp := keyFingerprint(req.Key)
	pre := n.gossipKeyAll(ctx, api.GossipKeyOp_GOSSIP_KEY_OP_LIST, nil)
	var bad []string
	for _, r := range pre.Nodes {
		switch {
		case r.Error != "":
			bad = append(bad, fmt.Sprintf("%s: %s", r.NodeId, r.Error))
		case r.Primary == "":
			bad = append(bad, fmt.Sprintf("%s: gossip is not encrypted (start it with a keyring)", r.NodeId))
		case req.Op == api.GossipKeyOp_GOSSIP_KEY_OP_USE && !slices.Contains(r.Keys, fp):
			bad = append(bad, fmt.Sprintf("%s: key %s not installed", r.NodeId, fp))
		case req.Op == api.GossipKeyOp_GOSSIP_KEY_OP_REMOVE && r.Primary == fp:
			bad = append(bad, fmt.Sprintf("%s: key %s is the primary; use another key first", r.NodeId, fp))
		}
	}
	if len(bad) > 0 {
		return nil, status.Errorf(codes.Aborted, "gossip key %s not changed on any node: %s", req.Op, strings.Join(bad, "; "))
	}
	p, _ := auth.FromContext(ctx)
	resp := n.gossipKeyAll(ctx, req.Op, req.Key)
	who := ""
	if p != nil {
		who = p.Key()
	}
	n.log.Info("node: gossip key operation", "op", req.Op.String(), "key", fp, "nodes", len(resp.Nodes), "failed", resp.Failed, "by", who)
	return resp, nil
}

// settingsProto is s as the Admin API shows it.
func settingsProto(s meta.Settings) *api.ClusterSettings {
	return &api.ClusterSettings{ReplicationFactor: uint32(s.ReplicationFactor), WriteQuorum: uint32(s.WriteQuorum), Codec: s.Codec.String()}
}

// mergeSettings applies req's non-zero fields to cur and validates the
// result: R and W within 1 <= W <= R <= meta.MaxReplicationFactor, a codec
// chunk knows. Anything else is InvalidArgument.
func mergeSettings(cur meta.Settings, req *api.SetSettingsRequest) (meta.Settings, error) {
	next := cur
	if req.ReplicationFactor > meta.MaxReplicationFactor {
		return cur, status.Errorf(codes.InvalidArgument, "set settings: replication factor %d exceeds %d", req.ReplicationFactor, meta.MaxReplicationFactor)
	}
	if req.WriteQuorum > meta.MaxReplicationFactor {
		return cur, status.Errorf(codes.InvalidArgument, "set settings: write quorum %d exceeds %d", req.WriteQuorum, meta.MaxReplicationFactor)
	}
	if req.ReplicationFactor != 0 {
		next.ReplicationFactor = int(req.ReplicationFactor)
	}
	if req.WriteQuorum != 0 {
		next.WriteQuorum = int(req.WriteQuorum)
	}
	if req.Codec != "" {
		c, err := chunk.ParseCodec(req.Codec)
		if err != nil {
			return cur, status.Errorf(codes.InvalidArgument, "set settings: %v", err)
		}
		next.Codec = c
	}
	if err := next.Validate(); err != nil {
		return cur, status.Errorf(codes.InvalidArgument, "set settings %+v: %v", next, err)
	}
	return next, nil
}

// GetSettings returns the cluster settings as this node has applied them,
// with their version.
func (s *adminService) GetSettings(context.Context, *api.GetSettingsRequest) (*api.GetSettingsResponse, error) {
	set, v := s.n.meta.VersionedSettings()
	return &api.GetSettingsResponse{Settings: settingsProto(set), NodeId: s.n.cfg.NodeID, Version: v}, nil
}

// SetSettings merges the request into the current settings, validates
// them and commits them through raft (forwarded to the leader from a
// follower); setSettings says how concurrent changes are kept apart.
// Changing R moves no data at once: new replicas fill by anti-entropy
// and copies beyond R are dropped at the next rebalance (a ring epoch
// change).
func (s *adminService) SetSettings(ctx context.Context, req *api.SetSettingsRequest) (*api.SetSettingsResponse, error) {
	p, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	prev, next, from, err := s.setSettings(ctx, req)
	if err != nil {
		return nil, err
	}
	resp := &api.SetSettingsResponse{Previous: settingsProto(prev), Settings: settingsProto(next), Version: from}
	if next != prev {
		// The version of this change once this node has applied it; 0
		// if a later change replaced it first.
		wctx, cancel := context.WithTimeout(ctx, settingsCatchUp)
		cur, nv := s.n.meta.WaitSettingsVersion(wctx, from+1)
		cancel()
		resp.Version = 0
		if cur == next && nv > from {
			resp.Version = nv
		}
	}
	s.n.log.Info("node: cluster settings changed", "previous", fmt.Sprintf("%+v", prev), "settings", fmt.Sprintf("%+v", next),
		"version", resp.Version, "by", p.Key())
	return resp, nil
}

// settingsCatchUp bounds how long SetSettings waits for this node to
// apply the settings version a request expects, or the change that beat
// its own.
const settingsCatchUp = 5 * time.Second

// settingsMergeTries bounds how often SetSettings merges a partial request
// again after another change committed first.
const settingsMergeTries = 16

// setSettings merges req into the settings this node holds and commits
// the result conditionally on the version it merged from, so a partial
// change never overwrites the fields another admin changed meanwhile (a
// change committed through another node that this one has not applied
// yet). With an expected version in req the condition is that version
// and a lost race is the caller's conflict; without one it is the
// settings merged from (meta.AtSettings), and a lost race is merged
// again once this node has applied the winner. Fields left at zero keep
// their values. It returns the version prev had.
func (s *adminService) setSettings(ctx context.Context, req *api.SetSettingsRequest) (prev, next meta.Settings, v uint64, err error) {
	prev, v = s.n.meta.VersionedSettings()
	if req.ExpectedVersion != nil && v < *req.ExpectedVersion {
		// The caller read the version from a node ahead of this one.
		wctx, cancel := context.WithTimeout(ctx, settingsCatchUp)
		prev, v = s.n.meta.WaitSettingsVersion(wctx, *req.ExpectedVersion)
		cancel()
	}
	if req.ExpectedVersion != nil && v < *req.ExpectedVersion {
		// Behind, not a conflict: the caller may ask again (here or
		// elsewhere) and succeed.
		return prev, next, v, status.Errorf(codes.Unavailable, "node: this node has applied settings version %d, not yet %d; try again", v, *req.ExpectedVersion)
	}
	if req.ExpectedVersion != nil && v != *req.ExpectedVersion {
		return prev, next, v, toStatus(fmt.Errorf("%w: this node holds version %d, not %d", meta.ErrSettingsVersion, v, *req.ExpectedVersion))
	}
	for try := 1; ; try++ {
		if next, err = mergeSettings(prev, req); err != nil {
			return prev, next, v, err
		}
		pre := meta.AtSettings(prev)
		if req.ExpectedVersion != nil {
			pre = meta.AtVersion(v)
		}
		err = s.n.meta.SetSettings(ctx, next, pre)
		if err == nil || req.ExpectedVersion != nil || !errors.Is(err, meta.ErrSettingsVersion) || try == settingsMergeTries {
			break
		}
		// Another change won: merge again once this node has applied it.
		wctx, cancel := context.WithTimeout(ctx, settingsCatchUp)
		var nv uint64
		prev, nv = s.n.meta.WaitSettingsVersion(wctx, v+1)
		cancel()
		if nv == v {
			return prev, next, v, status.Errorf(codes.Unavailable, "node: another settings change committed first and this node has not applied it within %v; try again", settingsCatchUp)
		}
		v = nv
	}
	if err != nil {
		return prev, next, v, toStatus(err)
	}
	return prev, next, v, nil
}
