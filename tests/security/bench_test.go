package security_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/node/nodetest"
)

// BenchmarkGetSecurity measures what mutual TLS and the token guard cost a
// client Get of one entry (2 layers x 2 heads x 16 dims x 4 tokens, BF16;
// about 1 KiB) from a one-node cluster, against plaintext.
func BenchmarkGetSecurity(b *testing.B) {
	for _, mode := range []string{"insecure", "tls", "tls+tokens"} {
		b.Run(mode, func(b *testing.B) {
			p := newPKI(b)
			cfg := nodetest.NodeConfig(b, "n1", nil)
			var ccfg client.Config
			switch mode {
			case "insecure":
				cfg.Insecure = true
			case "tls", "tls+tokens":
				cfg.TLS = files(p.dir, "n1")
				cfg.Tokens = mode == "tls+tokens"
				ccfg.TLS = files(p.dir, "app")
			}
			n := nodetest.StartNode(b, cfg)
			ctx, cancel := context.WithTimeout(b.Context(), time.Minute)
			defer cancel()
			testutil.WaitFor(b, "n1 ready", func() bool { return n.Ready() == nil })
			if cfg.Tokens {
				tok, rec, err := auth.NewToken("bench", auth.ScopeRead|auth.ScopeWrite|auth.ScopeAdmin, nil, time.Time{})
				if err != nil {
					b.Fatal(err)
				}
				if err := n.Meta().PutToken(ctx, rec); err != nil {
					b.Fatal(err)
				}
				ccfg.Token = tok.String()
			}
			ccfg.Seeds, ccfg.Logger = []string{n.GRPCAddr()}, quiet()
			c, err := client.New(ctx, ccfg)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			s := spec(2)
			if _, err := c.RegisterModel(ctx, s); err != nil {
				b.Fatal(err)
			}
			key, blob := testutil.StandaloneBlob(b, rand.New(rand.NewPCG(1, 1)), s, 4)
			if _, err := c.Put(ctx, blob); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(blob)))
			b.ResetTimer()
			for b.Loop() {
				if _, err := c.Get(ctx, key); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
