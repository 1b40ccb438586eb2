package chaos

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/tests/harness"
)

// observer talks to single nodes directly (not through the client's
// routing): metadata views, direct reads of one replica, metrics.
type observer struct {
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
	http  *http.Client
}

func newObserver() *observer {
	return &observer{conns: make(map[string]*grpc.ClientConn), http: &http.Client{Timeout: 3 * time.Second}}
}

func (o *observer) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, cc := range o.conns {
		_ = cc.Close()
	}
	o.conns = nil
	o.http.CloseIdleConnections()
}

func (o *observer) conn(addr string) (api.ClientClient, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	cc := o.conns[addr]
	if cc == nil {
		var err error
		cc, err = grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodecV2(api.Codec()), grpc.MaxCallRecvMsgSize(8<<20)))
		if err != nil {
			return nil, err
		}
		o.conns[addr] = cc
	}
	return api.NewClientClient(cc), nil
}

// view is one node's metadata, as a comparable string, and its models.
type nodeView struct {
	summary string
	leader  string
	members int
	models  []string
}

func (o *observer) view(ctx context.Context, addr string) (nodeView, error) {
	c, err := o.conn(addr)
	if err != nil {
		return nodeView{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := c.ClusterInfo(ctx, &api.ClusterInfoRequest{})
	if err != nil {
		return nodeView{}, err
	}
	mr, err := c.Models(ctx, &api.ModelsRequest{})
	if err != nil {
		return nodeView{}, err
	}
	var v nodeView
	for _, m := range mr.Models {
		v.models = append(v.models, api.FingerprintFromProto(m.Fingerprint).String())
	}
	slices.Sort(v.models)
	var members []string
	for _, m := range info.Members {
		members = append(members, m.Id+"@"+m.GrpcAddr)
	}
	slices.Sort(members)
	v.leader, v.members = info.LeaderId, len(members)
	v.summary = fmt.Sprintf("epoch=%d leader=%s rf=%d w=%d codec=%s members=%v models=%d",
		info.Epoch, info.LeaderId, info.ReplicationFactor, info.WriteQuorum, info.Codec, members, len(v.models))
	return v, nil
}

// errAbsent: the node answered that it does not hold the key.
var errAbsent = fmt.Errorf("absent")

// direct reads key from the node at addr only.
func (o *observer) direct(ctx context.Context, addr string, key chunk.Key) ([]byte, error) {
	c, err := o.conn(addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	st, err := c.Get(ctx, &api.GetRequest{Key: api.ProtoKey(key), Format: api.Format_FORMAT_ENTRY, Direct: true})
	if err != nil {
		return nil, err
	}
	var hdr api.GetHeader
	if err := api.RecvHeader(st, &hdr); err != nil {
		if status.Code(err) == codes.NotFound {
			return nil, errAbsent
		}
		return nil, err
	}
	if hdr.TotalBytes > 64<<20 {
		return nil, fmt.Errorf("answer of %d bytes", hdr.TotalBytes)
	}
	data := make([]byte, hdr.TotalBytes)
	if err := api.RecvBody(st, data); err != nil {
		return nil, err
	}
	return data, nil
}

// usage is a node's goroutines and heap in use, from /metrics.
type usage struct {
	goroutines float64
	heapInuse  float64
	rss        float64
}

func (o *observer) usage(ctx context.Context, httpAddr string) (usage, error) {
	m, err := harness.ScrapeWith(ctx, o.http, httpAddr)
	if err != nil {
		return usage{}, err
	}
	g, okG := m["go_goroutines"]
	h, okH := m["go_memstats_heap_inuse_bytes"]
	if !okG || !okH {
		return usage{}, fmt.Errorf("/metrics of %s lacks go_goroutines or go_memstats_heap_inuse_bytes", httpAddr)
	}
	return usage{goroutines: g, heapInuse: h, rss: m["process_resident_memory_bytes"]}, nil
}
