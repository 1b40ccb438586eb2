package security_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/gossip/gossipkey"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/tests/harness"
)

// The node's memory under the attacks of TestAttacks: its peak resident
// set (VmHWM) over its resident set before the attack, the bound
// docs/SECURITY.md states (section Limits).
const (
	// unauthenticatedGrowthBound: 60 concurrent 200k-item Lookups with a
	// client certificate and no token (refused before they are read).
	unauthenticatedGrowthBound = 64 << 20
	// readerGrowthBound: 200 concurrent 4096-item Lookups with a read
	// token (DefaultMaxUnary in flight, the rest refused unread).
	readerGrowthBound = 256 << 20
)

// limitNode is one kvmeshd process with mutual TLS and tokens, as the
// independent test ran it, and the tokens of its callers.
type limitNode struct {
	proc  *harness.Proc
	pki   pki
	root  string // read, write, admin; no namespace
	token map[string]string
}

// startLimitNode builds and starts kvmeshd with TLS, tokens and a DRAM
// tier of dram, and the tokens named in kinds (scopes and namespace).
func startLimitNode(t *testing.T, ctx context.Context, dram string, kinds map[string]tokenKind) *limitNode {
	t.Helper()
	dir := t.TempDir()
	bin, err := harness.Build(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	a := &limitNode{pki: newPKI(t), token: make(map[string]string)}
	var lines bytes.Buffer
	kinds["root"] = tokenKind{scopes: auth.TokenScopes}
	for name, k := range kinds {
		tok, rec, err := auth.NewToken(name, k.scopes, k.ns, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		lines.Write(append(b, '\n'))
		a.token[name] = tok.String()
	}
	a.root = a.token["root"]
	tokensFile := filepath.Join(dir, "tokens.jsonl")
	if err := os.WriteFile(tokensFile, lines.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	n1 := files(a.pki.dir, "n1")
	a.proc = harness.NewProc(harness.ProcConfig{Bin: bin, ID: "n1", Host: "127.0.0.1", DataDir: filepath.Join(dir, "n1"),
		LogPath: filepath.Join(dir, "n1.log"), Args: []string{"-bootstrap", "-local-timing", "-dram", dram, "-disk", "0", "-log-level", "warn",
			"-tls-ca", n1.CAFile, "-tls-cert", n1.CertFile, "-tls-key", n1.KeyFile, "-tokens", "-tokens-file", tokensFile}})
	if err := a.proc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.proc.Terminate(10 * time.Second); err != nil {
			t.Logf("kvmeshd: %v", err)
		}
		if t.Failed() {
			if b, err := os.ReadFile(a.proc.LogPath()); err == nil {
				t.Logf("kvmeshd's log ends:\n%s", b[max(0, len(b)-4000):])
			}
		}
	})
	// Ready once the tokens file's records are stored.
	creds := tlsCreds(t, files(a.pki.dir, "app"))
	testutil.WaitFor(t, "kvmeshd serves the root token", func() bool { return call(t, a.addr(), creds, a.root, false) == nil })
	return a
}

type tokenKind struct {
	scopes auth.Scope
	ns     auth.Namespace
}

func (a *limitNode) addr() string { return a.proc.Addr("grpc") }

// conn is a connection with the client certificate "app" and token (none
// if "").
func (a *limitNode) conn(t *testing.T, token string) *grpc.ClientConn {
	return conn(t, a.addr(), tlsCreds(t, files(a.pki.dir, "app")), token)
}

// memory reads the process's resident set and its peak (bytes).
func (a *limitNode) memory(t *testing.T) (rss, peak int64) {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", a.proc.Pid()))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			rss = kb << 10
		case "VmHWM":
			peak = kb << 10
		}
	}
	return rss, peak
}

// resetPeak starts the process's peak resident set again from its
// resident set now (clear_refs 5).
func (a *limitNode) resetPeak(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", a.proc.Pid()), []byte("5"), 0); err != nil {
		t.Skipf("cannot reset the peak resident set: %v", err)
	}
}

// refused reads kvmesh_requests_refused_total{method, reason} from the
// node's metrics.
func (a *limitNode) refused(t *testing.T, ctx context.Context, method, reason string) float64 {
	t.Helper()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	m, err := harness.ScrapeWith(ctx, &http.Client{Transport: tr}, a.proc.Addr("http"))
	if err != nil {
		t.Fatal(err)
	}
	return m[fmt.Sprintf("kvmesh_requests_refused_total{method=%q,reason=%q}", method, reason)]
}

// lookups runs conc goroutines, each making calls Lookups of items items
// of fp on cc, and counts their answers by code. The request is encoded
// once and sent as those bytes (rawCodec), so the test holds one copy.
func lookups(t *testing.T, ctx context.Context, cc *grpc.ClientConn, fp chunk.Fingerprint, conc, calls, items int) map[codes.Code]int {
	t.Helper()
	req := &api.LookupRequest{Fingerprint: api.ProtoFingerprint(fp)}
	for i := range items {
		req.Items = append(req.Items, &api.LookupItem{Content: api.ProtoID(chunk.ID{Lo: uint64(i) + 1, Hi: 7}),
			Want: &api.Context{Kind: api.ContextKind_CONTEXT_KIND_STANDALONE}})
	}
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	out := make(map[codes.Code]int)
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for range calls {
				err := cc.Invoke(ctx, api.Client_Lookup_FullMethodName, rawMessage(b), new(api.LookupResponse), grpc.ForceCodecV2(rawCodec{}))
				mu.Lock()
				out[status.Code(err)]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// TestAttacks runs the attacks of an independent test of a cluster with
// mutual TLS and tokens against a kvmeshd process; each must fail:
//   - memory exhaustion before authentication: Lookups of 200k items with
//     a client certificate and no token are refused before they are read,
//     and 4096-item ones with a read token are held to DefaultMaxUnary at
//     once; the node's peak memory stays within the documented bounds;
//   - a namespaced admin token is no cluster admin: it cannot change the
//     settings, the gossip keys, nor drain the node;
//   - Put headers that announce 8 MiB and send 1 KiB evict nothing;
//   - Stats shows a namespaced caller no node-wide counts, and a token
//     outside its namespace looks like one that does not exist;
//   - a request that does not decode is counted as a refusal.
func TestAttacks(t *testing.T) {
	testutil.SkipIfShort(t, "kvmeshd processes")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	victim, attacker := spec(16), spec(15)
	fpV, fpA := victim.Fingerprint(), attacker.Fingerprint()
	nsV, nsA := auth.Namespace{fpV.String()}, auth.Namespace{fpA.String()}
	a := startLimitNode(t, ctx, "64M", map[string]tokenKind{
		"reader":         {scopes: auth.ScopeRead},
		"victim":         {scopes: auth.ScopeRead | auth.ScopeWrite, ns: nsV},
		"attacker":       {scopes: auth.ScopeRead | auth.ScopeWrite, ns: nsA},
		"attacker-admin": {scopes: auth.TokenScopes, ns: nsA},
	})
	app := files(a.pki.dir, "app")
	ops := dialAddr(t, ctx, a.addr(), client.Config{TLS: app, Token: a.root})
	for _, s := range []chunk.ModelSpec{victim, attacker} {
		if _, err := ops.RegisterModel(ctx, s); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("lookups without a token", func(t *testing.T) {
		cc := a.conn(t, "")
		before, _ := a.memory(t)
		a.resetPeak(t)
		got := lookups(t, ctx, cc, fpV, 60, 1, 200_000)
		_, peak := a.memory(t)
		t.Logf("60 concurrent 200k-item Lookups, no token: %v; RSS %d MB before, peak %d MB", got, before>>20, peak>>20)
		if got[codes.Unauthenticated] != 60 {
			t.Errorf("answers %v, want 60 Unauthenticated", got)
		}
		if peak-before > unauthenticatedGrowthBound {
			t.Errorf("peak RSS %d MB, %d MB over the %d MB before: more than %d MB", peak>>20, (peak-before)>>20, before>>20, unauthenticatedGrowthBound>>20)
		}
	})

	t.Run("lookups with a read token", func(t *testing.T) {
		cc := a.conn(t, a.token["reader"])
		before, _ := a.memory(t)
		a.resetPeak(t)
		got := lookups(t, ctx, cc, fpV, 200, 3, node4096)
		_, peak := a.memory(t)
		t.Logf("200 concurrent 4096-item Lookups (3 each), read token: %v; RSS %d MB before, peak %d MB", got, before>>20, peak>>20)
		if got[codes.OK] == 0 || got[codes.OK]+got[codes.ResourceExhausted] != 600 {
			t.Errorf("answers %v, want OK and ResourceExhausted only", got)
		}
		if peak-before > readerGrowthBound {
			t.Errorf("peak RSS %d MB, %d MB over the %d MB before: more than %d MB", peak>>20, (peak-before)>>20, before>>20, readerGrowthBound>>20)
		}
	})

	t.Run("namespaced admin", func(t *testing.T) {
		cc := a.conn(t, a.token["attacker-admin"])
		admin, cl := api.NewAdminClient(cc), api.NewClientClient(cc)
		_, err := admin.SetSettings(ctx, &api.SetSettingsRequest{ReplicationFactor: 1, WriteQuorum: 1, Codec: "int4"})
		wantCode(t, "set settings", err, codes.PermissionDenied)
		_, err = admin.GetSettings(ctx, &api.GetSettingsRequest{})
		wantCode(t, "get settings", err, codes.PermissionDenied)
		key, err := gossipkey.Generate()
		if err != nil {
			t.Fatal(err)
		}
		_, err = admin.GossipKeys(ctx, &api.GossipKeyRequest{Op: api.GossipKeyOp_GOSSIP_KEY_OP_INSTALL, Key: key})
		wantCode(t, "install a gossip key", err, codes.PermissionDenied)
		_, err = admin.GossipKeys(ctx, &api.GossipKeyRequest{Op: api.GossipKeyOp_GOSSIP_KEY_OP_LIST})
		wantCode(t, "list gossip keys", err, codes.PermissionDenied)
		st, err := cl.Drain(ctx, &api.DrainRequest{})
		if err == nil {
			_, err = st.Recv()
		}
		wantCode(t, "drain", err, codes.PermissionDenied)
		// Its own namespace is still its own: a token inside it.
		_, err = admin.CreateToken(ctx, &api.CreateTokenRequest{Name: "sub", Scopes: "read"})
		wantCode(t, "create a token in its namespace", err, codes.OK)
		// Another tenant's token looks like no token at all.
		victimID, _, _ := strings.Cut(a.token["victim"], ".")
		_, errOther := admin.RevokeToken(ctx, &api.RevokeTokenRequest{Id: victimID})
		_, errNone := admin.RevokeToken(ctx, &api.RevokeTokenRequest{Id: "0123456789abcdef"})
		wantCode(t, "revoke another tenant's token", errOther, codes.NotFound)
		if m1, m2 := status.Convert(errOther).Message(), strings.ReplaceAll(status.Convert(errNone).Message(), "0123456789abcdef", victimID); m1 != m2 {
			t.Errorf("revoking another tenant's token says %q, an unknown one %q", m1, m2)
		}
		// The node is still serving, in its settings.
		if err := call(t, a.addr(), tlsCreds(t, app), a.root, false); err != nil {
			t.Fatalf("the node stopped serving: %v", err)
		}
	})

	t.Run("stats in a namespace", func(t *testing.T) {
		resp, err := api.NewClientClient(a.conn(t, a.token["attacker"])).Stats(ctx, &api.StatsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Entries != 0 || resp.Bytes != 0 || len(resp.Tiers) != 0 {
			t.Errorf("a namespaced caller sees node-wide counts: %v", resp)
		}
	})

	t.Run("malformed request", func(t *testing.T) {
		method := api.Client_Lookup_FullMethodName
		before := a.refused(t, ctx, method, "malformed")
		// Field 2 (items) claims 100 bytes that are not there.
		err := a.conn(t, a.token["reader"]).Invoke(ctx, method, rawMessage{0x12, 100, 1}, new(api.LookupResponse), grpc.ForceCodecV2(rawCodec{}))
		wantCode(t, "malformed lookup", err, codes.Internal)
		testutil.WaitFor(t, "the malformed request counted", func() bool { return a.refused(t, ctx, method, "malformed") == before+1 })
	})

	t.Run("put headers", func(t *testing.T) {
		vc := dialAddr(t, ctx, a.addr(), client.Config{TLS: app, Token: a.token["victim"]})
		rng := rand.New(rand.NewPCG(35, 4))
		// The victim fills DRAM with entries of about 1 MiB, until they
		// evict each other.
		for dramStats(t, ctx, ops, a.addr()).Evictions == 0 {
			_, blob := testutil.StandaloneBlob(t, rng, victim, 512)
			if _, err := vc.Put(ctx, blob); err != nil {
				t.Fatal(err)
			}
		}
		before := dramStats(t, ctx, ops, a.addr())
		// 64 Puts announcing 8 MiB that send 1 KiB and end.
		cc := a.conn(t, a.token["attacker"])
		k, _ := testutil.StandaloneBlob(t, rng, attacker, 1)
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for range 64 {
			wg.Go(func() { errs <- headerOnly(ctx, cc, k, 8<<20, 1<<10) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if status.Code(err) == codes.OK {
				t.Errorf("a put of 1 KiB of 8 MiB succeeded")
			}
		}
		after := dramStats(t, ctx, ops, a.addr())
		t.Logf("victim's DRAM tier: %d entries, %d evictions before; %d, %d after", before.Entries, before.Evictions, after.Entries, after.Evictions)
		if after.Evictions != before.Evictions || after.Entries != before.Entries {
			t.Errorf("put headers evicted: DRAM tier %d entries %d evictions before, %d %d after", before.Entries, before.Evictions, after.Entries, after.Evictions)
		}
	})
}

// node4096 is node.MaxLookupBatch, the items a Lookup may carry.
const node4096 = 4096

// rawMessage is a request sent as the bytes given (rawCodec).
type rawMessage []byte

// rawCodec sends a rawMessage as it is and everything else as protobuf.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(rawMessage); ok {
		return mem.BufferSlice{mem.SliceBuffer(r)}, nil
	}
	return encoding.GetCodecV2("proto").Marshal(v)
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return encoding.GetCodecV2("proto").Unmarshal(data, v)
}

// headerOnly opens a Put, sends a header announcing size bytes, then
// sent bytes of data, and ends the stream; it returns the Put's answer.
func headerOnly(ctx context.Context, cc *grpc.ClientConn, key chunk.Key, size, sent int) error {
	st, err := cc.NewStream(ctx, &api.Client_ServiceDesc.Streams[0], api.Client_Put_FullMethodName, grpc.ForceCodecV2(api.Codec()))
	if err != nil {
		return err
	}
	if err := st.SendMsg(&api.Frame{Header: &api.PutHeader{Key: api.ProtoKey(key), BlobBytes: uint64(size)}}); err != nil {
		return err
	}
	if err := st.SendMsg(&api.Frame{Data: mem.BufferSlice{mem.SliceBuffer(make([]byte, sent))}}); err != nil {
		return err
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	return st.RecvMsg(new(api.PutResponse))
}

// dialAddr is a client of the node at addr.
func dialAddr(t *testing.T, ctx context.Context, addr string, cfg client.Config) *client.Client {
	t.Helper()
	cfg.Seeds, cfg.Logger, cfg.Attempts = []string{addr}, quiet(), 1
	c, err := client.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// dramStats is the node's DRAM tier as Stats reports it to an
// unrestricted caller.
func dramStats(t *testing.T, ctx context.Context, c *client.Client, addr string) *api.TierStats {
	t.Helper()
	st, err := c.Stats(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, tier := range st.Tiers {
		if tier.Name == "dram" {
			return tier
		}
	}
	t.Fatal("no DRAM tier in Stats")
	return nil
}
