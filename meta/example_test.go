package meta_test

import (
	"context"
	"log"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/meta"
)

// The wiring a node does: raft first, since gossip announces its address;
// then gossip as the Peers; then writes from anywhere.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := meta.Open(ctx, meta.Config{
		NodeID:          "n1",
		RaftBind:        "127.0.0.1:0",
		DataDir:         "/var/lib/kvmesh/n1",
		BootstrapExpect: 3,
		GRPCAddr:        "10.0.0.1:7070",
		// Forward: the node's gRPC forwarder to the leader.
	})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	g, err := gossip.Start(gossip.Config{
		NodeID: "n1", BindAddr: "127.0.0.1",
		Meta:  gossip.NodeMeta{ID: "n1", GRPCAddr: "10.0.0.1:7070", RaftAddr: store.RaftAddr()},
		Seeds: []string{"10.0.0.2:7946"},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer g.Shutdown()
	store.SetPeers(g)

	if err := store.WaitLeader(ctx); err != nil {
		log.Fatal(err)
	}
	fp, err := store.RegisterModel(ctx, chunk.ModelSpec{
		Family: "qwen3", Layers: 36, KVHeads: 8, HeadDim: 128, DType: chunk.BF16,
		RopeStyle: chunk.RopeNeoX, RopeTheta: 1e6,
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("model %v, ring epoch %d, replicas of a chunk: %v",
		fp, store.Ring().Epoch(), store.Ring().Replicas(chunk.ID{Lo: 1}, store.Settings().ReplicationFactor))
}
