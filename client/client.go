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
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/ring"
	"github.com/kvmesh/kvmesh/tlsconf"
)

// Config configures New. Zero fields take the documented defaults.
type Config struct {
	// Seeds are gRPC addresses (host:port) of any cluster members
	// (required).
	Seeds []string
	// RPCTimeout bounds one attempt on one node. Default 10 s.
	RPCTimeout time.Duration
	// Attempts is how many rounds over a request's replicas are tried,
	// with a ring refresh and a backoff between rounds. Default 4.
	Attempts int
	// Backoff is the first pause between rounds; it doubles up to
	// MaxBackoff. Defaults 50 ms and 1 s.
	Backoff, MaxBackoff time.Duration
	// FrameBytes is the data frame size of Put. Default
	// api.DefaultFrameBytes.
	FrameBytes int
	// Limits bound the entries Get accepts. Zero means
	// chunk.DefaultLimits.
	Limits chunk.Limits
	// DialOptions are added to every connection (tests use bufconn
	// dialers).
	DialOptions []grpc.DialOption
	// TLS names the CA, client certificate and key for a cluster running
	// mutual TLS (a client certificate from `kvmesh certs -client`). No
	// files means plaintext, for nodes started with Insecure.
	TLS tlsconf.Config
	// Token is an API token ("<id>.<secret>") sent on every call as
	// "authorization: Bearer"; only over TLS unless TLS.Insecure is set.
	Token string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// DefaultConfig is the configuration of every field New defaults: the
// values a zero field takes. The caller sets Seeds (and TLS and Token for
// a secured cluster) before New.
func DefaultConfig() Config {
	return Config{
		RPCTimeout: 10 * time.Second,
		Attempts:   4,
		Backoff:    50 * time.Millisecond,
		MaxBackoff: time.Second,
		FrameBytes: api.DefaultFrameBytes,
		Limits:     chunk.DefaultLimits,
	}
}

// Validate reports what New would refuse before dialing: no seeds, or TLS
// files it cannot use.
func (c Config) Validate() error {
	c, err := c.withDefaults()
	if err != nil {
		return err
	}
	_, err = DialOptions(c)
	return err
}

// withDefaults checks c and gives its zero (or negative) fields
// DefaultConfig's values.
func (c Config) withDefaults() (Config, error) {
	if len(c.Seeds) == 0 {
		return c, errors.New("client: Config.Seeds is empty")
	}
	d := DefaultConfig()
	if c.RPCTimeout <= 0 {
		c.RPCTimeout = d.RPCTimeout
	}
	if c.Attempts <= 0 {
		c.Attempts = d.Attempts
	}
	if c.Backoff <= 0 {
		c.Backoff = d.Backoff
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = d.MaxBackoff
	}
	if c.FrameBytes <= 0 {
		c.FrameBytes = d.FrameBytes
	}
	if c.Limits == (chunk.Limits{}) {
		c.Limits = d.Limits
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// Errors callers branch on. gRPC status codes pass through otherwise.
var (
	// ErrNoNodes: no seed or member answered.
	ErrNoNodes = errors.New("client: no cluster node answered")
	// ErrNotFound: the key is stored on no replica.
	ErrNotFound = errors.New("client: not found")
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

// Refresh fetches ClusterInfo from a member (or a seed) and adopts its
// ring unless it is older than the one the client has.
func (c *Client) Refresh(ctx context.Context) error {
	var last error = ErrNoNodes
	for _, addr := range c.candidates() {
		cc, err := c.conn(addr)
		if err != nil {
			last = err
			continue
		}
		actx, cancel := context.WithTimeout(ctx, c.cfg.RPCTimeout)
		info, err := api.NewClientClient(cc).ClusterInfo(actx, &api.ClusterInfoRequest{})
		cancel()
		if err != nil {
			last = err
			if ctx.Err() != nil {
				break
			}
			continue
		}
		c.adopt(info)
		return nil
	}
	return fmt.Errorf("%w: %w", ErrNoNodes, last)
}

func (c *Client) adopt(info *api.ClusterInfoResponse) {
	for {
		old := c.view.Load()
		if old.info.Epoch > info.Epoch || (old.info.Epoch == info.Epoch && len(old.info.Members) > 0 && len(info.Members) == 0) {
			return
		}
		members := make([]ring.Member, len(info.Members))
		for i, m := range info.Members {
			members[i] = api.MemberFromProto(m)
		}
		rf := max(int(info.ReplicationFactor), 1)
		if c.view.CompareAndSwap(old, &view{ring: ring.New(info.Epoch, members), info: info, rf: rf}) {
			return
		}
	}
}

// candidates lists the addresses to ask for cluster info: members first,
// then the seeds.
func (c *Client) candidates() []string {
	seen := make(map[string]bool)
	var out []string
	for _, m := range c.view.Load().ring.Members() {
		if m.GRPCAddr != "" && !seen[m.GRPCAddr] {
			seen[m.GRPCAddr] = true
			out = append(out, m.GRPCAddr)
		}
	}
	for _, s := range c.cfg.Seeds {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// noteEpoch refreshes the ring in the background when a node answered with
// a newer epoch than the client's.
func (c *Client) noteEpoch(md metadata.MD) {
	v := md.Get(api.EpochHeader)
	if len(v) == 0 {
		return
	}
	e, err := strconv.ParseUint(v[0], 10, 64)
	if err != nil || e <= c.view.Load().info.Epoch {
		return
	}
	if !c.refreshing.CompareAndSwap(false, true) {
		return
	}
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		defer c.refreshing.Store(false)
		ctx, cancel := context.WithTimeout(c.bgCtx, c.cfg.RPCTimeout)
		defer cancel()
		if err := c.Refresh(ctx); err != nil {
			c.log.Debug("client: ring refresh", "err", err)
		}
	}()
}

// retryable reports whether another replica (or a later round) may
// succeed where err failed: the node was unreachable, overloaded, too
// slow, recovering (Unavailable), saw another ring epoch (Aborted), or
// found its own stored copy damaged (DataLoss; it dropped it).
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.DataLoss:
		return true
	}
	return false
}

// unknownModel reports whether err is a node's "unknown model" (a
// FailedPrecondition with the reason api.ReasonUnknownModel). A node
// whose metadata lags (a model registered a moment ago through another
// node) says it too, so the other replicas are asked; when all of them
// say it, the model is unknown and no later round is tried (each node
// already waited for its metadata).
func unknownModel(err error) bool {
	st, _ := status.FromError(err)
	if st.Code() != codes.FailedPrecondition {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == api.ErrorDomain && info.GetReason() == api.ReasonUnknownModel {
			return true
		}
	}
	return false
}

// targets returns the nodes to try for content, in order: its replicas,
// or every member (then seeds) when content is nil or the ring is empty.
func (c *Client) targets(content *chunk.ID) []string {
	v := c.view.Load()
	var out []string
	if content != nil && v.ring.Len() > 0 {
		for _, m := range v.ring.Replicas(*content, v.rf) {
			out = append(out, m.GRPCAddr)
		}
		return out
	}
	return c.candidates()
}

// do runs call on the targets of content until one succeeds, failing over
// on retryable errors (and, within a round, on an unknown model) and
// refreshing the ring between rounds.
func (c *Client) do(ctx context.Context, content *chunk.ID, call func(ctx context.Context, cc *grpc.ClientConn) error) error {
	backoff := c.cfg.Backoff
	var last error = ErrNoNodes
	for round := 0; round < c.cfg.Attempts; round++ {
		for _, addr := range c.targets(content) {
			cc, err := c.conn(addr)
			if err != nil {
				last = err
				continue
			}
			actx, cancel := context.WithTimeout(ctx, c.cfg.RPCTimeout)
			err = call(actx, cc)
			cancel()
			if err == nil {
				return nil
			}
			last = err
			if ctx.Err() != nil {
				return last
			}
			if !retryable(err) && !unknownModel(err) {
				return err
			}
		}
		if round+1 == c.cfg.Attempts || unknownModel(last) {
			break
		}
		if err := c.Refresh(ctx); err != nil {
			c.log.Debug("client: ring refresh", "err", err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return last
		case <-t.C:
		}
		backoff = min(2*backoff, c.cfg.MaxBackoff)
	}
	return last
}

// ClusterInfo asks a node for the cluster's members, leader and settings.
func (c *Client) ClusterInfo(ctx context.Context) (*api.ClusterInfoResponse, error) {
	var info *api.ClusterInfoResponse
	err := c.do(ctx, nil, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		info, err = api.NewClientClient(cc).ClusterInfo(ctx, &api.ClusterInfoRequest{})
		return err
	})
	if err == nil {
		c.adopt(info)
	}
	return info, err
}

// RegisterModel registers spec cluster-wide and returns its fingerprint.
func (c *Client) RegisterModel(ctx context.Context, spec chunk.ModelSpec) (chunk.Fingerprint, error) {
	var resp *api.RegisterModelResponse
	err := c.do(ctx, nil, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = api.NewClientClient(cc).RegisterModel(ctx, &api.RegisterModelRequest{Spec: api.ProtoSpec(spec)})
		return err
	})
	if err != nil {
		return chunk.Fingerprint{}, err
	}
	return api.FingerprintFromProto(resp.Fingerprint), nil
}

// Models lists the registered models.
func (c *Client) Models(ctx context.Context) ([]chunk.ModelSpec, error) {
	var resp *api.ModelsResponse
	err := c.do(ctx, nil, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = api.NewClientClient(cc).Models(ctx, &api.ModelsRequest{})
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]chunk.ModelSpec, 0, len(resp.Models))
	for _, m := range resp.Models {
		spec, err := api.SpecFromProto(m.Spec)
		if err != nil {
			return nil, err
		}
		out = append(out, spec)
	}
	return out, nil
}

// PutResult says where a Put landed and which version of the key the
// cluster keeps.
type PutResult struct {
	// Checksum is that of the entry this Put stored (after the node put it
	// in the cluster codec).
	Checksum uint64
	StoredOn []string
	// AlreadyStored: the key was already held with other bytes and the
	// cluster keeps those (they Win: the smaller checksum); this Put's
	// bytes were dropped. Not an error: two honest producers of a chunk
	// may encode slightly different bytes.
	AlreadyStored bool
	// Kept is the checksum of the version the cluster keeps: Checksum
	// unless AlreadyStored.
	Kept uint64
}

// Put stores an encoded entry (chunk.Encode's output) on its replica set.
// The blob is sent without copies and must not change until Put returns.
// The cluster stores it in its codec (Codec): a raw or lossless entry in
// another codec is transcoded once by the node that receives it, and the
// result's Checksum is then that of the stored bytes; a lossy entry is
// stored as it is.
func (c *Client) Put(ctx context.Context, blob []byte) (PutResult, error) {
	hd, err := chunk.ParseHeader(blob, c.cfg.Limits)
	if err != nil {
		return PutResult{}, err
	}
	var resp *api.PutResponse
	err = c.do(ctx, &hd.Key.Content, func(ctx context.Context, cc *grpc.ClientConn) error {
		var md metadata.MD
		st, err := api.NewClientClient(cc).Put(ctx, grpc.Header(&md))
		if err != nil {
			return err
		}
		defer func() { c.noteEpoch(md) }()
		if err := api.SendHeader(st, &api.PutHeader{Key: api.ProtoKey(hd.Key), BlobBytes: uint64(len(blob))}); err != nil {
			return api.PutSendErr(st, err)
		}
		if err := api.SendBody(st, mem.SliceBuffer(blob), c.cfg.FrameBytes); err != nil {
			return api.PutSendErr(st, err)
		}
		resp, err = st.CloseAndRecv()
		return err
	})
	if err != nil {
		return PutResult{}, err
	}
	res := PutResult{Checksum: resp.Checksum, StoredOn: resp.StoredOn, AlreadyStored: resp.AlreadyStored, Kept: resp.KeptChecksum}
	if res.Kept == 0 {
		res.Kept = res.Checksum // a node that does not say kept this Put's entry
	}
	return res, nil
}

// PutEntry encodes e in the cluster's codec (Codec) and stores it as Put
// does.
func (c *Client) PutEntry(ctx context.Context, e *chunk.Entry) (PutResult, error) {
	blob, err := chunk.Encode(nil, e, c.Codec())
	if err != nil {
		return PutResult{}, err
	}
	return c.Put(ctx, blob)
}

// Get reads the whole encoded entry of key and verifies every checksum. A
// replica that sends corrupt bytes is skipped.
func (c *Client) Get(ctx context.Context, key chunk.Key) ([]byte, error) {
	return c.GetInto(ctx, key, nil)
}

// GetInto is Get reading the entry into buf when it has the capacity (else
// into a new buffer): a caller that reads many entries reuses one buffer
// instead of allocating, faulting in and clearing one of the entry's size
// per call. The result aliases buf in that case.
func (c *Client) GetInto(ctx context.Context, key chunk.Key, buf []byte) ([]byte, error) {
	var blob []byte
	err := c.do(ctx, &key.Content, func(ctx context.Context, cc *grpc.ClientConn) error {
		hdr, data, err := c.get(ctx, cc, &api.GetRequest{Key: api.ProtoKey(key), Format: api.Format_FORMAT_ENTRY}, buf)
		if err != nil {
			return err
		}
		if uint64(len(data)) != hdr.TotalBytes {
			return status.Error(codes.Unavailable, "short entry")
		}
		vh, err := chunk.Verify(data, c.cfg.Limits)
		if err != nil || vh.Key != key {
			// Wrong bytes from one replica: try another.
			return status.Errorf(codes.Unavailable, "replica sent a bad entry for %v: %v", key, err)
		}
		blob = data
		return nil
	})
	return blob, notFound(err)
}

func notFound(err error) error {
	if status.Code(err) == codes.NotFound {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	return err
}

// RangeResult is a decoded slice of an entry: K and V of layers
// [LayerLo, LayerHi) and heads [HeadLo, HeadHi) in the layout
// [layer][K|V][token][head][head_dim].
type RangeResult struct {
	Shape  chunk.Shape
	Range  chunk.Range
	Tokens []uint32
	Data   []byte
}

// GetRange reads the decoded K/V of a layer and head range of key (the
// zero Range means all).
func (c *Client) GetRange(ctx context.Context, key chunk.Key, r chunk.Range) (RangeResult, error) {
	var out RangeResult
	req := &api.GetRequest{Key: api.ProtoKey(key), Format: api.Format_FORMAT_RAW,
		LayerLo: uint32(r.LayerLo), LayerHi: uint32(r.LayerHi), HeadLo: uint32(r.HeadLo), HeadHi: uint32(r.HeadHi)}
	err := c.do(ctx, &key.Content, func(ctx context.Context, cc *grpc.ClientConn) error {
		hdr, data, err := c.get(ctx, cc, req, nil)
		if err != nil {
			return err
		}
		out = RangeResult{Shape: api.ShapeFromProto(hdr.Shape), Tokens: hdr.Tokens, Data: data,
			Range: chunk.Range{LayerLo: int(hdr.LayerLo), LayerHi: int(hdr.LayerHi), HeadLo: int(hdr.HeadLo), HeadHi: int(hdr.HeadHi)}}
		if len(data) != out.Range.RangeBytes(out.Shape) {
			return status.Error(codes.Unavailable, "range of the wrong size")
		}
		return nil
	})
	return out, notFound(err)
}

// get reads an answer into buf when it has the capacity, else into a new
// buffer.
func (c *Client) get(ctx context.Context, cc *grpc.ClientConn, req *api.GetRequest, buf []byte) (*api.GetHeader, []byte, error) {
	st, err := api.NewClientClient(cc).Get(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	var hdr api.GetHeader
	if err := api.RecvHeader(st, &hdr); err != nil {
		return nil, nil, err
	}
	if md, err := st.Header(); err == nil {
		c.noteEpoch(md)
	}
	if hdr.TotalBytes > uint64(c.cfg.Limits.MaxBlobBytes) {
		return nil, nil, status.Errorf(codes.ResourceExhausted, "answer of %d bytes exceeds limits", hdr.TotalBytes)
	}
	data := buf[:0]
	if uint64(cap(buf)) >= hdr.TotalBytes {
		data = buf[:hdr.TotalBytes]
	} else {
		data = make([]byte, hdr.TotalBytes)
	}
	if err := api.RecvBody(st, data); err != nil {
		return nil, nil, err
	}
	return &hdr, data, nil
}

// LookupItem asks for the best encoding of Content for use after Want.
type LookupItem struct {
	Content chunk.ID
	Want    chunk.Context
}

// LookupResult answers one LookupItem: the key found (unless
// chunk.MatchMiss) and the replicas of the content, those that hold the key
// first.
type LookupResult struct {
	Match   chunk.Match
	Key     chunk.Key
	Holders []ring.Member
}

// maxBatch matches node.MaxLookupBatch.
const maxBatch = 4096

// Lookup answers items, in order, with one call per replica set (split in
// batches of at most 4096).
func (c *Client) Lookup(ctx context.Context, fp chunk.Fingerprint, items []LookupItem) ([]LookupResult, error) {
	out := make([]LookupResult, len(items))
	v := c.view.Load()
	groups := make(map[string][]int)
	var order []string
	for i, it := range items {
		g := ""
		if v.ring.Len() > 0 {
			if m, ok := v.ring.Owner(it.Content); ok {
				g = m.ID
			}
		}
		if len(groups[g]) == 0 {
			order = append(order, g)
		}
		groups[g] = append(groups[g], i)
	}
	var batches [][]int
	for _, g := range order {
		idx := groups[g]
		for len(idx) > 0 {
			n := min(len(idx), maxBatch)
			batches = append(batches, idx[:n])
			idx = idx[n:]
		}
	}
	errs := make([]error, len(batches))
	var wg sync.WaitGroup
	for bi, idx := range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[bi] = c.lookupBatch(ctx, fp, items, idx, out)
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

func (c *Client) lookupBatch(ctx context.Context, fp chunk.Fingerprint, items []LookupItem, idx []int, out []LookupResult) error {
	req := &api.LookupRequest{Fingerprint: api.ProtoFingerprint(fp), Items: make([]*api.LookupItem, len(idx))}
	for j, i := range idx {
		req.Items[j] = &api.LookupItem{Content: api.ProtoID(items[i].Content), Want: api.ProtoContext(items[i].Want)}
	}
	content := items[idx[0]].Content
	var resp *api.LookupResponse
	err := c.do(ctx, &content, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		var md metadata.MD
		resp, err = api.NewClientClient(cc).Lookup(ctx, req, grpc.Header(&md))
		c.noteEpoch(md)
		return err
	})
	if err != nil {
		return err
	}
	if len(resp.Results) != len(idx) {
		return fmt.Errorf("client: lookup answered %d of %d items", len(resp.Results), len(idx))
	}
	for j, i := range idx {
		r := resp.Results[j]
		res := LookupResult{Match: api.MatchFromProto(r.Status)}
		if res.Match != chunk.MatchMiss {
			k, err := api.KeyFromProto(r.Key)
			if err != nil {
				return err
			}
			res.Key = k
		}
		for _, h := range r.Holders {
			res.Holders = append(res.Holders, api.MemberFromProto(h))
		}
		out[i] = res
	}
	return nil
}

// Delete removes key from its replicas and returns how many held it.
func (c *Client) Delete(ctx context.Context, key chunk.Key) (int, error) {
	var resp *api.DeleteResponse
	err := c.do(ctx, &key.Content, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = api.NewClientClient(cc).Delete(ctx, &api.DeleteRequest{Key: api.ProtoKey(key)})
		return err
	})
	if err != nil {
		return 0, notFound(err)
	}
	return int(resp.Deleted), nil
}

// Stats asks the node at addr for its store statistics.
func (c *Client) Stats(ctx context.Context, addr string) (*api.StatsResponse, error) {
	st, _, err := c.StatsAndState(ctx, addr)
	return st, err
}

// StatsAndState is Stats that also returns the node's state: "ready", or
// why it is not (api.StateHeader; empty when the node does not say).
func (c *Client) StatsAndState(ctx context.Context, addr string) (*api.StatsResponse, string, error) {
	cc, err := c.conn(addr)
	if err != nil {
		return nil, "", err
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RPCTimeout)
	defer cancel()
	var md metadata.MD
	st, err := api.NewClientClient(cc).Stats(ctx, &api.StatsRequest{}, grpc.Header(&md))
	if err != nil {
		return nil, "", err
	}
	var state string
	if v := md.Get(api.StateHeader); len(v) > 0 {
		state = v[0]
	}
	return st, state, nil
}

// Drain asks the node at addr to drain itself (Client.Drain, an admin
// call): copy every chunk it holds to the chunk's other owners and, unless
// keepMembership, leave the cluster. progress, if not nil, gets each
// progress message; Drain returns the last one once the node is done. The
// call runs as long as the drain does, bounded only by ctx.
func (c *Client) Drain(ctx context.Context, addr string, keepMembership bool, progress func(*api.DrainProgress)) (*api.DrainProgress, error) {
	cc, err := c.conn(addr)
	if err != nil {
		return nil, err
	}
	st, err := api.NewClientClient(cc).Drain(ctx, &api.DrainRequest{KeepMembership: keepMembership})
	if err != nil {
		return nil, err
	}
	var last *api.DrainProgress
	for {
		p, err := st.Recv()
		if errors.Is(err, io.EOF) {
			if last == nil || last.Phase != "done" {
				return last, fmt.Errorf("client: drain of %s ended before it was done", addr)
			}
			return last, nil
		}
		if err != nil {
			return last, err
		}
		last = p
		if progress != nil {
			progress(p)
		}
	}
}
