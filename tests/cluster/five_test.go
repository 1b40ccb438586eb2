package cluster

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/tests/harness"
)

// nodeModels asks one node (not the cluster) for its models and its view
// of the leader.
func nodeView(ctx context.Context, addr string) (models []string, leader string, epoch uint64, err error) {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, "", 0, err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c := api.NewClientClient(cc)
	mr, err := c.Models(ctx, &api.ModelsRequest{})
	if err != nil {
		return nil, "", 0, err
	}
	info, err := c.ClusterInfo(ctx, &api.ClusterInfoRequest{})
	if err != nil {
		return nil, "", 0, err
	}
	for _, m := range mr.Models {
		models = append(models, api.FingerprintFromProto(m.Fingerprint).String())
	}
	slices.Sort(models)
	return models, info.LeaderId, info.Epoch, nil
}

// TestFiveProcessesLeaderLoss kills the raft leader of a 5-process cluster
// and checks that a new one is elected, that writes of metadata work again
// and that every live node agrees on it.
func TestFiveProcessesLeaderLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	hosts := []string{"127.0.0.21", "127.0.0.22", "127.0.0.23", "127.0.0.24", "127.0.0.25"}
	checkBindable(t, hosts...)
	bin := buildKvmeshd(t)
	var procs []*harness.Proc
	for i, h := range hosts {
		args := []string{"-bootstrap-expect", "5", "-local-timing",
			"-dead-grace", "1h", "-dram", "32M", "-rpc-timeout", "3s"}
		if i > 0 {
			args = append(args, "-join", procs[0].Addr("gossip"))
		}
		procs = append(procs, start(t, bin, fmt.Sprintf("n%d", i+1), h, t.TempDir(), args...))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	byID := make(map[string]*harness.Proc)
	var seeds []string
	for _, p := range procs {
		byID[p.ID()] = p
		seeds = append(seeds, p.Addr("grpc"))
	}
	c, err := client.New(ctx, client.Config{Seeds: seeds, RPCTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	leader := waitMembers(ctx, t, c, 5).LeaderId
	spec := testutil.Spec()
	if _, err := c.RegisterModel(ctx, spec); err != nil {
		t.Fatal(err)
	}

	lp := byID[leader]
	lp.Kill()
	var live []*harness.Proc
	for _, p := range procs {
		if p != lp {
			live = append(live, p)
		}
	}
	// A new leader, and a metadata write through whichever node the
	// client reaches.
	testutil.WaitFor(t, "a new leader after killing "+leader, func() bool {
		_, l, _, err := nodeView(ctx, live[0].Addr("grpc"))
		return err == nil && l != "" && l != leader
	})
	spec2 := spec
	spec2.Salt = "after leader loss"
	if _, err := c.RegisterModel(ctx, spec2); err != nil {
		t.Fatalf("register after leader loss: %v", err)
	}
	want := []string{spec.Fingerprint().String(), spec2.Fingerprint().String()}
	slices.Sort(want)
	var views []string
	defer func() {
		if t.Failed() {
			t.Logf("the live nodes' last views: %v", views)
		}
	}()
	testutil.WaitFor(t, "the live nodes to agree on the models and a new leader", func() bool {
		agree := true
		views = views[:0]
		for _, p := range live {
			models, l, epoch, err := nodeView(ctx, p.Addr("grpc"))
			views = append(views, fmt.Sprintf("%s: %v leader %s epoch %d err %v", p.ID(), models, l, epoch, err))
			if err != nil || !slices.Equal(models, want) || l == "" || l == leader {
				agree = false
			}
		}
		return agree
	})
}

// getFrom reads key's whole entry through one node (which may fetch it
// from the replicas).
func getFrom(ctx context.Context, addr string, key chunk.Key) ([]byte, error) {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(api.Codec())))
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := api.NewClientClient(cc).Get(ctx, &api.GetRequest{Key: api.ProtoKey(key)})
	if err != nil {
		return nil, err
	}
	var hdr api.GetHeader
	if err := api.RecvHeader(st, &hdr); err != nil {
		return nil, err
	}
	blob := make([]byte, hdr.TotalBytes)
	if err := api.RecvBody(st, blob); err != nil {
		return nil, err
	}
	return blob, nil
}
