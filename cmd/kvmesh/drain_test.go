package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/nodetest"
)

// TestDrainCommand runs `kvmesh drain` against an in-process 3-node
// cluster: an unknown node is an error naming the members; -keep copies
// the node's chunks and reports progress and the result.
func TestDrainCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// RPCTimeout 0 keeps the node's default (longer than nodetest's 3 s)
	// for the drain's copies between members.
	nodes := nodetest.Start(t, 3, nodetest.Config{Node: func(_ int, cfg *node.Config) { cfg.RPCTimeout = 0 }}).Nodes
	c, err := client.New(ctx, client.Config{Seeds: []string{nodes[0].GRPCAddr()}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	spec := testutil.Spec()
	if _, err := c.RegisterModel(ctx, spec); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 3))
	var keys []chunk.Key
	for i := range 8 {
		tokens := []uint32{uint32(i), rng.Uint32N(1000), rng.Uint32N(1000)}
		key, blob := testutil.Blob(t, rng, spec, tokens, chunk.StandaloneContext())
		if _, err := c.Put(ctx, blob); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, key)
	}
	// R=3 of 3 nodes: n3 holds all 8 keys once the writes' stragglers
	// (acknowledged at W=2, the third replica still in flight) are done;
	// the drain below reports how many it holds.
	cc, err := grpc.NewClient(nodes[2].GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(api.Codec())))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	for _, k := range keys {
		testutil.WaitFor(t, fmt.Sprintf("%v on n3", k), func() bool {
			st, err := api.NewClientClient(cc).Get(ctx, &api.GetRequest{Key: api.ProtoKey(k), Format: api.Format_FORMAT_ENTRY, Direct: true})
			if err == nil {
				_, err = st.Recv()
			}
			return err == nil
		})
	}

	tests := []struct {
		name    string
		args    []string
		wantErr string
		want    []string
	}{
		{"unknown node", []string{"drain", "n9"}, `no member "n9" (members: n1, n2, n3)`, nil},
		{"no node", []string{"drain"}, "usage: kvmesh drain", nil},
		{"keep by ID", []string{"drain", "-keep", "n3"}, "", []string{"draining n3 (" + nodes[2].GRPCAddr() + ")", "draining  moved", "n3 drained (8 keys held", "still a member"}},
		{"keep by address", []string{"drain", "-keep", nodes[1].GRPCAddr()}, "", []string{"draining n2", "n2 drained", "still a member"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := run(ctx, append([]string{"-addr", nodes[0].GRPCAddr()}, tc.args...), &out, &errb)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v\n%s%s", err, out.String(), errb.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Fatalf("output lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
	if nodes[2].Meta().Ring().Len() != 3 {
		t.Fatal("a -keep drain changed the ring")
	}
}
