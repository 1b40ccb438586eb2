package node

import (
	"context"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/auth"
)

// callGate is the node's tap handle (grpc.InTapHandle): it runs when a
// call's headers arrive, before gRPC reads a byte of its message, and
// authorises the call (the Guard, from the token in the metadata) and
// takes the caller's slot (streams, or unary calls) there. A caller
// without a valid token thus costs the node a header, never a decoded
// request, and a caller at its limit is refused before its request is
// read. The Guard's interceptors then find the Principal in the context
// and do not check again; the observer releases the slot when the call
// returns (and the stream's end does, for a call that never reached a
// handler). Refusals here are counted and audited as the observer's.
//
// gRPC runs it on the connection's reader with the transport's lock held:
// it must not block (token lookups read the applied metadata in memory).
func (n *Node) callGate(obs *callObserver) tap.ServerInHandle {
	streaming := sync.OnceValue(func() map[string]bool {
		m := make(map[string]bool)
		for svc, info := range n.grpcSrv.GetServiceInfo() {
			for _, mi := range info.Methods {
				m["/"+svc+"/"+mi.Name] = mi.IsClientStream || mi.IsServerStream
			}
		}
		return m
	})
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		method := info.FullMethodName
		p, err := n.sec.guard.Authorize(ctx, method)
		var release func()
		if err == nil {
			release, err = n.sec.acquire(p, streaming()[method])
		}
		if err != nil {
			obs.done(ctx, method, nil, nil, err)
			return nil, err
		}
		ctx = auth.WithPrincipal(ctx, p)
		if release != nil {
			context.AfterFunc(ctx, release)
			ctx = context.WithValue(ctx, slotKey{}, release)
		}
		return ctx, nil
	}
}

// slotKey holds, in a call's context, the release of its slot.
type slotKey struct{}

// releaseSlot gives back the slot callGate took for the call of ctx; a
// second release does nothing.
func releaseSlot(ctx context.Context) {
	if release, ok := ctx.Value(slotKey{}).(func()); ok {
		release()
	}
}

// acquire takes p's slot for a call: a stream slot (MaxStreamsPerClient,
// members included), or a unary one (MaxUnaryPerClient). Members (as
// checkPeer tells them) are not held to the unary limit: their calls are
// the cluster's own fan-out (lookups, deletes, digests for every client),
// bounded by their callers'.
func (s *security) acquire(p *auth.Principal, stream bool) (func(), error) {
	if stream {
		return s.limiter.Acquire(p.Key())
	}
	if p.Peer() || (s.tls.Insecure() && p.CertName == "") { // member(ctx), before ctx holds p
		return nil, nil
	}
	return s.unary.Acquire(p.Key())
}

// serverCodec is the codec the node's gRPC server decodes with: api's,
// with the lists of client requests capped (api.CapLists) at what their
// handlers accept, so a request too long to serve is not decoded whole
// first.
func (n *Node) serverCodec() encoding.CodecV2 {
	chunks := min(n.cfg.MaxChunksPerRequest, MaxLookupBatch)
	return api.CapLists(api.Codec(),
		api.ListCap{Field: (&api.LookupRequest{}).ProtoReflect().Descriptor().Fields().ByName("items"), Max: chunks},
		api.ListCap{Field: (&api.InjectRequest{}).ProtoReflect().Descriptor().Fields().ByName("chunks"), Max: n.cfg.MaxChunksPerRequest},
		api.ListCap{Field: (&api.FetchManyRequest{}).ProtoReflect().Descriptor().Fields().ByName("keys"), Max: n.cfg.MaxChunksPerRequest},
		api.ListCap{Field: (&api.CreateTokenRequest{}).ProtoReflect().Descriptor().Fields().ByName("namespace"), Max: auth.MaxNamespace},
	)
}

// undecodable is a stats.Handler that counts the requests gRPC could not
// decode as refusals (reason "malformed"): gRPC answers them Internal
// before any interceptor runs, so the observer never sees them.
type undecodable struct{ obs *callObserver }

// unmarshalFailed starts the message of gRPC's status for a request its
// codec refused.
const unmarshalFailed = "grpc: failed to unmarshal the received message"

type methodKey struct{}

func (u undecodable) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	return context.WithValue(ctx, methodKey{}, info.FullMethodName)
}

func (u undecodable) HandleRPC(ctx context.Context, s stats.RPCStats) {
	end, ok := s.(*stats.End)
	if !ok || end.Client || end.Error == nil {
		return
	}
	st := status.Convert(end.Error)
	if st.Code() != codes.Internal || !strings.HasPrefix(st.Message(), unmarshalFailed) {
		return
	}
	method, _ := ctx.Value(methodKey{}).(string)
	u.obs.malformed(ctx, method, end.Error)
}

func (undecodable) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (undecodable) HandleConn(context.Context, stats.ConnStats)                       {}

var _ stats.Handler = undecodable{}
