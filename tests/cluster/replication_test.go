package cluster

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/tests/framework"
)

// getDirect reads key from addr's own store only (no replica fallback).
func getDirect(ctx context.Context, addr string, key chunk.Key) ([]byte, error) {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(api.Codec())))
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := api.NewClientClient(cc).Get(ctx, &api.GetRequest{Key: api.ProtoKey(key), Direct: true})
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

// TestKillReplicaDuringWrites crashes one of three nodes while four
// writers stream puts: every put acknowledged by a write quorum stays
// readable, and the killed node, restarted, receives the hints of the
// writes it missed. One body, run in process and on kvmeshd processes
// (SIGKILL).
func TestKillReplicaDuringWrites(t *testing.T) {
	testutil.SkipIfShort(t, "three-node clusters under writes")
	runners := []framework.Runner{framework.InProcess{},
		framework.Processes{Bin: buildKvmeshd, Hosts: []string{"127.0.0.21", "127.0.0.22", "127.0.0.23"}}}
	framework.Run(t, 3, framework.Options{}, runners, killReplicaDuringWrites)
}

func killReplicaDuringWrites(t *testing.T, fc framework.Cluster) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c := fc.Client()
	spec := testutil.Spec()
	if _, err := c.RegisterModel(ctx, spec); err != nil {
		t.Fatal(err)
	}

	type acked struct {
		key       chunk.Key
		blob      []byte
		afterKill bool // the put started once the victim was dead
	}
	const writers, perWriter = 4, 20
	var (
		mu     sync.Mutex
		ok     []acked
		failed int
		dead   atomic.Bool
		wg     sync.WaitGroup
	)
	kill := make(chan struct{})
	const victim = 2
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 99))
			for i := range perWriter {
				k, b := testutil.StandaloneBlob(t, rng, spec, 8+i)
				after := dead.Load()
				res, err := c.Put(ctx, b)
				mu.Lock()
				switch {
				case err != nil:
					failed++
				case len(res.StoredOn) < 2:
					t.Errorf("put acknowledged by %v, below the write quorum", res.StoredOn)
				default:
					ok = append(ok, acked{k, b, after})
					if len(ok) == 15 {
						close(kill)
					}
				}
				mu.Unlock()
			}
		}()
	}
	select {
	case <-kill:
	case <-ctx.Done():
		t.Fatal("writes did not start")
	}
	fc.Kill(victim)
	dead.Store(true)
	wg.Wait()
	if t.Failed() {
		return
	}
	if len(ok) < writers*perWriter/2 {
		t.Fatalf("only %d of %d puts acknowledged (%d failed)", len(ok), writers*perWriter, failed)
	}
	for i, a := range ok {
		got, err := c.Get(ctx, a.key)
		if err != nil {
			t.Fatalf("acknowledged put %d lost: %v", i, err)
		}
		if !bytes.Equal(got, a.blob) {
			t.Fatalf("acknowledged put %d: bytes differ", i)
		}
	}

	// The victim comes back on its addresses: hints of the writes it
	// missed reach its (empty, DRAM-only) store.
	if err := fc.Restart(ctx, victim); err != nil {
		t.Fatal(err)
	}
	missed := 0
	for _, a := range ok {
		if !a.afterKill {
			continue
		}
		missed++
		testutil.WaitFor(t, fmt.Sprintf("the hint of %v on the restarted node", a.key), func() bool {
			got, err := getDirect(ctx, fc.GRPCAddr(victim), a.key)
			if err == nil && !bytes.Equal(got, a.blob) {
				t.Fatalf("hinted %v: bytes differ", a.key)
			}
			return err == nil
		})
	}
	t.Logf("%d acknowledged (%d while the victim was dead, all hinted back), %d failed", len(ok), missed, failed)
}
