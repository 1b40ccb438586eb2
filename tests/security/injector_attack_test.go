package security_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/inject"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/pagedkv"
	"github.com/kvmesh/kvmesh/tests/harness"
)

// attackNode is one kvmeshd process with TLS and tokens, and the tokens
// the attacks use.
type attackNode struct {
	proc                   *harness.Proc
	app                    client.Config // TLS of the client certificate "app"
	admin, tenantA, reader string
	pkiDir                 string // the CA and certificates
	specA                  chunk.ModelSpec
	fpA                    chunk.Fingerprint
	grpcAddr               string
}

// startAttackNode runs kvmeshd (built from this tree) as a one-node
// cluster with mutual TLS and -tokens; its tokens file holds an admin, a
// read-write token of namespace A (the victim tenant) and a read token of
// every namespace (the attacker).
func startAttackNode(t *testing.T, ctx context.Context) *attackNode {
	t.Helper()
	if err := harness.Bindable("127.0.0.1"); err != nil {
		t.Skip(err)
	}
	bctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	bin, err := harness.Build(bctx, t.TempDir())
	if errors.Is(err, harness.ErrNoGo) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	p := newPKI(t)
	dir := t.TempDir()
	a := &attackNode{specA: spec(2), pkiDir: p.dir}
	a.fpA = a.specA.Fingerprint()
	var lines []byte
	for _, tk := range []struct {
		dst    *string
		name   string
		scopes auth.Scope
		ns     auth.Namespace
	}{
		{&a.admin, "ops", auth.ScopeRead | auth.ScopeWrite | auth.ScopeAdmin, nil},
		{&a.tenantA, "a", auth.ScopeRead | auth.ScopeWrite, auth.Namespace{a.fpA.String()[:16]}},
		{&a.reader, "reader", auth.ScopeRead, nil},
	} {
		tok, rec, err := auth.NewToken(tk.name, tk.scopes, tk.ns, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		line, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(append(lines, line...), '\n')
		*tk.dst = tok.String()
	}
	tokens := filepath.Join(dir, "tokens.jsonl")
	if err := os.WriteFile(tokens, lines, 0o600); err != nil {
		t.Fatal(err)
	}
	n1 := files(p.dir, "n1")
	a.proc = harness.NewProc(harness.ProcConfig{Bin: bin, ID: "n1", Host: "127.0.0.1", DataDir: filepath.Join(dir, "n1"),
		LogPath: filepath.Join(dir, "n1.log"), Args: []string{"-bootstrap", "-local-timing", "-dram", "64M",
			"-tls-ca", n1.CAFile, "-tls-cert", n1.CertFile, "-tls-key", n1.KeyFile, "-tokens", "-tokens-file", tokens}})
	if err := a.proc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.proc.Terminate(10 * time.Second) })
	a.grpcAddr = a.proc.Addr("grpc")
	a.app = client.Config{TLS: files(p.dir, "app")}
	creds := tlsCreds(t, a.app.TLS)
	testutil.WaitFor(t, "the tokens file's records", func() bool { return call(t, a.grpcAddr, creds, a.admin, false) == nil })
	return a
}

// client is a client of the node holding token.
func (a *attackNode) client(t *testing.T, token string) *client.Client {
	t.Helper()
	cfg := a.app
	cfg.Seeds, cfg.Token, cfg.Logger, cfg.Attempts, cfg.RPCTimeout = []string{a.grpcAddr}, token, quiet(), 1, 10*time.Second
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, err := client.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// injector is a raw Injector client holding token.
func (a *attackNode) injector(t *testing.T, token string) api.InjectorClient {
	t.Helper()
	cc, err := grpc.NewClient(a.grpcAddr, grpc.WithTransportCredentials(tlsCreds(t, a.app.TLS)),
		grpc.WithPerRPCCredentials(auth.TokenCredentials(token, false)),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(api.Codec())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return api.NewInjectorClient(cc)
}

// withPath adds field 8 (the path a RegisterCacheRequest used to carry,
// now reserved) to req, as a client built before the change sends it.
func withPath(t *testing.T, req *api.RegisterCacheRequest, path string) *api.RegisterCacheRequest {
	t.Helper()
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	b = protowire.AppendTag(b, 8, protowire.BytesType)
	b = protowire.AppendString(b, path)
	out := &api.RegisterCacheRequest{}
	if err := proto.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// procFiles lists the descriptors of process pid that are regular files
// or memfds, with where they point.
func procFiles(t *testing.T, pid int) map[int]string {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Skipf("cannot list the node's descriptors: %v", err)
	}
	out := map[int]string{}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil || strings.HasPrefix(target, "socket:") || strings.HasPrefix(target, "pipe:") ||
			strings.HasPrefix(target, "anon_inode:") || strings.HasPrefix(target, "/dev/") {
			continue
		}
		out[fd] = target
	}
	return out
}

// TestInjectorAttacks runs the attacks on the injector against a real
// kvmeshd: a client holding a read token, on the node's machine, tries to
// make the node map the node's own DRAM arena and its other files (by
// path as before, and by handing the descriptor over itself), a tenant's
// registered memfd and /dev/shm cache, the memfd of a victim engine in
// another process, and to use or learn of the tenant's cache IDs. Every attempt is refused
// with one answer that describes nothing, and the tenant's entries and
// cache keep working.
func TestInjectorAttacks(t *testing.T) {
	testutil.SkipIfShort(t, "builds and runs kvmeshd")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	a := startAttackNode(t, ctx)
	ops := a.client(t, a.admin)
	if _, err := ops.RegisterModel(ctx, a.specA); err != nil {
		t.Fatal(err)
	}
	// The victim tenant's entries.
	victim := a.client(t, a.tenantA)
	rng := rand.New(rand.NewPCG(35, 1))
	var keys []chunk.Key
	var tokens [][]uint32
	for range 40 {
		toks := testutil.Tokens(rng, 16)
		key, blob := testutil.Blob(t, rng, a.specA, toks, chunk.StandaloneContext())
		if _, err := victim.Put(ctx, blob); err != nil {
			t.Fatal(err)
		}
		keys, tokens = append(keys, key), append(tokens, toks)
	}
	// The victim's engine: a memfd cache and a /dev/shm one, registered.
	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 64, BlockSize: 16, KVHeads: a.specA.KVHeads, HeadDim: a.specA.HeadDim, DType: chunk.F32}
	reg := func(shm *inject.ShmCache) client.CacheRegistration {
		return client.CacheRegistration{Fingerprint: a.fpA, Layers: a.specA.Layers, Layouts: []pagedkv.CacheLayout{lay},
			MaxPositions: 4096, File: shm.Memory.File, Offsets: shm.Memory.Offsets}
	}
	memShm, err := inject.CreateShm("", a.specA.Layers, []pagedkv.CacheLayout{lay})
	if err != nil {
		t.Skipf("shared memory: %v", err)
	}
	defer memShm.Close()
	shmPath := fmt.Sprintf("/dev/shm/kvmesh-attack-%d-%d", os.Getpid(), rng.Uint64())
	dirShm, err := inject.CreateShm(shmPath, a.specA.Layers, []pagedkv.CacheLayout{lay})
	if err != nil {
		t.Skipf("shared memory: %v", err)
	}
	defer dirShm.Close()
	memInj, err := victim.RegisterCache(ctx, a.grpcAddr, reg(memShm))
	if err != nil {
		t.Fatal(err)
	}
	dirInj, err := victim.RegisterCache(ctx, a.grpcAddr, reg(dirShm))
	if err != nil {
		t.Fatal(err)
	}

	attacker := a.injector(t, a.reader)
	base := &api.RegisterCacheRequest{Fingerprint: api.ProtoFingerprint(a.fpA), Layers: int32(a.specA.Layers),
		Layouts: []*api.CacheLayout{api.ProtoLayout(lay)}, MaxPositions: 4096, MemoryKind: api.MemoryKind_MEMORY_KIND_SHM}
	const refused = "shared memory refused"
	wantRefused := func(what string, err error) {
		t.Helper()
		if st := status.Convert(err); err == nil || st.Code() != codes.PermissionDenied || st.Message() != refused {
			t.Errorf("%s: %v, want PermissionDenied %q", what, err, refused)
		}
	}
	sock, err := attacker.CacheSocket(ctx, &api.CacheSocketRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// handOver hands f to the node and registers it: refused at the
	// socket (the single refusal byte) or at RegisterCache.
	handOver := func(what string, f *os.File) {
		t.Helper()
		h, err := api.SendCacheFile(ctx, sock.Address, f)
		if errors.Is(err, api.ErrCacheRefused) {
			return
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		r := proto.Clone(base).(*api.RegisterCacheRequest)
		r.MemoryHandle = h
		_, err = attacker.RegisterCache(ctx, r)
		wantRefused(what, err)
	}

	// 1. The node's own files, the DRAM arena first: by path, as the
	// injector used to accept, and by descriptor.
	pid := a.proc.Pid()
	files := procFiles(t, pid)
	arena := false
	for fd, target := range files {
		path := fmt.Sprintf("/proc/%d/fd/%d", pid, fd)
		arena = arena || strings.Contains(target, "kvtier-dram")
		_, err := attacker.RegisterCache(ctx, withPath(t, base, path))
		wantRefused(fmt.Sprintf("the node's %s registered by path %s", target, path), err)
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			continue // not ours to open: the node's user differs
		}
		handOver(fmt.Sprintf("the node's %s handed over", target), f)
		f.Close()
	}
	if !arena {
		t.Errorf("no DRAM arena among the node's files %v", files)
	}

	// 2. The victim's memfd and /dev/shm file, by path and by a
	// descriptor opened anew: the node maps them already.
	memPath := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), memShm.Memory.File.Fd())
	for _, path := range []string{memPath, shmPath} {
		_, err := attacker.RegisterCache(ctx, withPath(t, base, path))
		wantRefused("the victim's cache registered by path "+path, err)
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		handOver("the victim's cache "+path+" handed over", f)
		f.Close()
	}

	// 2b. Another process's memfd: a victim engine in its own process
	// registered it; the attacker opens it through /proc/<pid>/fd.
	vpid, vfd := startVictim(t, ctx, a)
	vpath := fmt.Sprintf("/proc/%d/fd/%d", vpid, vfd)
	_, err = attacker.RegisterCache(ctx, withPath(t, base, vpath))
	wantRefused("another process's memfd registered by path "+vpath, err)
	if f, err := os.OpenFile(vpath, os.O_RDWR, 0); err == nil {
		handOver("another process's memfd "+vpath+" handed over", f)
		f.Close()
	} else {
		t.Logf("the victim's memfd cannot be opened here (%v): the path attack alone", err)
	}

	// 3. No oracle: paths that name nothing, a directory, a file of
	// another kind, a large tmpfs file are all answered alike.
	big := filepath.Join("/dev/shm", fmt.Sprintf("kvmesh-attack-big-%d", os.Getpid()))
	if err := os.WriteFile(big, nil, 0o600); err == nil {
		defer os.Remove(big)
		_ = os.Truncate(big, 64<<20)
	}
	for _, path := range []string{"/dev/shm/kvmesh-no-such-file", "/dev/shm", "/etc/passwd", big, "/proc/1/fd/0"} {
		_, err := attacker.RegisterCache(ctx, withPath(t, base, path))
		wantRefused("path "+path, err)
	}

	// 4. The victim's cache IDs (small integers, as the attacker would
	// guess them): the attacker hears what an unknown ID gets, for Inject
	// and for UnregisterCache.
	unknownInject := func(cid uint64) error {
		st, err := attacker.Inject(ctx, &api.InjectRequest{CacheId: cid})
		if err == nil {
			_, err = st.Recv()
		}
		return err
	}
	unknown := uint64(1 << 40)
	want := status.Convert(unknownInject(unknown))
	wantU := status.Convert(func() error {
		_, err := attacker.UnregisterCache(ctx, &api.UnregisterCacheRequest{CacheId: unknown})
		return err
	}())
	if want.Code() != codes.NotFound || wantU.Code() != codes.NotFound {
		t.Fatalf("an unknown cache ID: %v, %v", want.Err(), wantU.Err())
	}
	for cid := uint64(1); cid <= 8; cid++ {
		subst := func(m string) string {
			return strings.ReplaceAll(m, strconv.FormatUint(unknown, 10), strconv.FormatUint(cid, 10))
		}
		if got := status.Convert(unknownInject(cid)); got.Code() != want.Code() || got.Message() != subst(want.Message()) {
			t.Errorf("Inject into cache %d: %v; an unknown ID gets %v", cid, got.Err(), want.Err())
		}
		_, err := attacker.UnregisterCache(ctx, &api.UnregisterCacheRequest{CacheId: cid})
		if got := status.Convert(err); got.Code() != wantU.Code() || got.Message() != subst(wantU.Message()) {
			t.Errorf("UnregisterCache %d: %v; an unknown ID gets %v", cid, got.Err(), wantU.Err())
		}
	}

	// The victim is unharmed: every entry reads back, and its caches
	// take an injection (both still registered: the attacker's
	// unregisters did nothing).
	for i, k := range keys {
		if _, err := victim.Get(ctx, k); err != nil {
			t.Fatalf("entry %d after the attacks: %v", i, err)
		}
	}
	for name, inj := range map[string]*client.Injector{"memfd": memInj, "/dev/shm": dirInj} {
		res, err := inj.InjectChunks(ctx, []pagedkv.InjectChunk{{Key: keys[0], Tokens: tokens[0], Pos: 0, Slots: slots(16)}})
		if err != nil || res[0].Match != chunk.MatchExact {
			t.Errorf("the victim's %s cache after the attacks: %v %+v", name, err, res)
		}
		if err := inj.Close(ctx); err != nil {
			t.Errorf("the victim unregisters its %s cache: %v", name, err)
		}
	}
}

// slots is 0..n-1.
func slots(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// startVictim runs a victim engine in another process (this test binary,
// TestInjectorVictimProcess) that registers a memfd cache of its own with
// the node, and returns its pid and the memfd's descriptor number there.
// The process ends with the test.
func startVictim(t *testing.T, ctx context.Context, a *attackNode) (pid, fd int) {
	t.Helper()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestInjectorVictimProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "KVMESH_TEST_VICTIM="+a.grpcAddr, "KVMESH_TEST_VICTIM_TOKEN="+a.tenantA,
		"KVMESH_TEST_VICTIM_PKI="+a.pkiDir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close() // the victim unregisters and exits
		_ = cmd.Wait()
	})
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "victim fd="); ok {
			fd, err := strconv.Atoi(v)
			if err != nil {
				t.Fatal(err)
			}
			go func() { _, _ = io.Copy(io.Discard, out) }()
			return cmd.Process.Pid, fd
		}
	}
	t.Fatalf("the victim process registered no cache: %v", sc.Err())
	return 0, 0
}

// TestInjectorVictimProcess is the victim engine of TestInjectorAttacks,
// run as its own process: it registers a memfd cache with the node named
// by KVMESH_TEST_VICTIM, prints the memfd's descriptor and holds the
// cache until its stdin closes.
func TestInjectorVictimProcess(t *testing.T) {
	addr := os.Getenv("KVMESH_TEST_VICTIM")
	if addr == "" {
		t.Skip("the victim process of TestInjectorAttacks")
	}
	sp := spec(2)
	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 16, BlockSize: 16, KVHeads: sp.KVHeads, HeadDim: sp.HeadDim, DType: chunk.F32}
	shm, err := inject.CreateShm("", sp.Layers, []pagedkv.CacheLayout{lay})
	if err != nil {
		t.Fatal(err)
	}
	defer shm.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c, err := client.New(ctx, client.Config{Seeds: []string{addr}, TLS: files(os.Getenv("KVMESH_TEST_VICTIM_PKI"), "app"),
		Token: os.Getenv("KVMESH_TEST_VICTIM_TOKEN"), Logger: quiet(), Attempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	inj, err := c.RegisterCache(ctx, addr, client.CacheRegistration{Fingerprint: sp.Fingerprint(), Layers: sp.Layers,
		Layouts: []pagedkv.CacheLayout{lay}, MaxPositions: 1024, File: shm.Memory.File, Offsets: shm.Memory.Offsets})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("victim fd=%d\n", shm.Memory.File.Fd())
	_, _ = io.Copy(io.Discard, os.Stdin)
	if err := inj.Close(ctx); err != nil {
		t.Error(err)
	}
}
