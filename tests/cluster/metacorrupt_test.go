package cluster

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/tests/harness"
)

// Damaged Raft state on disk (a flipped bit in an old log entry, a
// truncated log, a damaged snapshot, a damaged wal-meta.db): kvmeshd must
// refuse to start on it, exit 1 (not 2, which says "usage"), never panic,
// and say what recovers the node; a ring that differs from the leader's
// keeps a node not ready. These tests run on 127.0.0.71-73.

// metaHosts are the loopback addresses of these tests.
var metaHosts = []string{"127.0.0.71", "127.0.0.72", "127.0.0.73"}

// soloArgs start a one-node cluster without a disk tier.
var soloArgs = []string{"-bootstrap", "-local-timing", "-dram", "32M", "-disk", "0"}

// registerRevs registers testutil.Spec() once per revision: each is its
// own raft log entry, whose bytes hold the revision.
func registerRevs(t *testing.T, ctx context.Context, p *harness.Proc, revs ...string) []chunk.Fingerprint {
	t.Helper()
	c, err := client.New(ctx, client.Config{Seeds: []string{p.Addr("grpc")}, RPCTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var fps []chunk.Fingerprint
	for _, rev := range revs {
		spec := testutil.Spec()
		spec.WeightsRevision = rev
		fp, err := c.RegisterModel(ctx, spec)
		if err != nil {
			t.Fatalf("register %s: %v", rev, err)
		}
		fps = append(fps, fp)
	}
	return fps
}

// flipMarker flips the last bit of the first occurrence of marker in the
// files matching pattern.
func flipMarker(t *testing.T, pattern, marker string) string {
	t.Helper()
	files, _ := filepath.Glob(pattern)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if i := bytes.Index(b, []byte(marker)); i >= 0 {
			b[i+len(marker)-1] ^= 0x01
			if err := os.WriteFile(f, b, 0o644); err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("%q not found in %s (files %v)", marker, pattern, files)
	return ""
}

// wantRefused starts p on its damaged data directory and wants it to exit
// 1 before it listens, without a panic, with a message that names the
// damage (mention) and the way out: moving DATA/raft aside.
func wantRefused(t *testing.T, ctx context.Context, p *harness.Proc, dataDir, mention string) {
	t.Helper()
	before, _ := os.ReadFile(p.LogPath())
	err := p.Start(ctx)
	if err == nil {
		p.Kill()
		t.Fatalf("%s started on damaged raft state", p.ID())
	}
	<-p.Exited()
	var ee *exec.ExitError
	if !errors.As(p.ExitErr(), &ee) {
		t.Fatalf("%s: start: %v; exit: %v", p.ID(), err, p.ExitErr())
	}
	all, _ := os.ReadFile(p.LogPath())
	out := string(all[len(before):])
	if ee.ExitCode() != 1 {
		t.Fatalf("%s exited %d, want 1; its output:\n%s", p.ID(), ee.ExitCode(), out)
	}
	raftDir := filepath.Join(dataDir, "raft")
	for _, want := range []string{"raft state on disk is damaged", mention, "mv " + raftDir + " " + raftDir + ".damaged"} {
		if !strings.Contains(out, want) {
			t.Fatalf("%s's output does not say %q:\n%s", p.ID(), want, out)
		}
	}
	for _, bad := range []string{"panic", "goroutine "} {
		if strings.Contains(out, bad) {
			t.Fatalf("%s's output holds %q:\n%s", p.ID(), bad, out)
		}
	}
	t.Logf("%s refused to start: %s", p.ID(), strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:]))
}

// soloStopped runs a one-node cluster on a new data directory, registers
// revs, stops it with SIGTERM (which snapshots) and returns it stopped.
func soloStopped(t *testing.T, ctx context.Context, revs ...string) (*harness.Proc, string) {
	t.Helper()
	checkBindable(t, metaHosts[0])
	bin := buildKvmeshd(t)
	dir := t.TempDir()
	p := start(t, bin, "m1", metaHosts[0], dir, soloArgs...)
	registerRevs(t, ctx, p, revs...)
	if err := p.Terminate(30 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	return p, dir
}

// startMetaCluster starts three kvmeshd (DRAM only) bootstrapping together
// on metaHosts, and picks a follower as the victim whose data directory a
// test damages: it returns the processes, a client of the cluster (closed
// at cleanup), and the victim with its data directory.
func startMetaCluster(ctx context.Context, t *testing.T) (procs []*harness.Proc, c *client.Client, victim *harness.Proc, vdir string) {
	t.Helper()
	checkBindable(t, metaHosts...)
	bin := buildKvmeshd(t)
	var dirs []string
	for i, h := range metaHosts {
		dirs = append(dirs, t.TempDir())
		args := []string{"-bootstrap-expect", "3", "-local-timing", "-dead-grace", "1h", "-dram", "32M", "-disk", "0", "-rpc-timeout", "3s"}
		if i > 0 {
			args = append(args, "-join", procs[0].Addr("gossip"))
		}
		procs = append(procs, start(t, bin, fmt.Sprintf("m%d", i+1), h, dirs[i], args...))
	}
	var seeds []string
	for _, p := range procs {
		seeds = append(seeds, p.Addr("grpc"))
	}
	c, err := client.New(ctx, client.Config{Seeds: seeds, RPCTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	info := waitMembers(ctx, t, c, 3)
	victim, vdir = procs[2], dirs[2]
	if info.LeaderId == victim.ID() {
		victim, vdir = procs[1], dirs[1]
	}
	return procs, c, victim, vdir
}

// TestRaftLogBitFlipRefused flips a bit in an old entry of a follower's
// raft log (the case this guards: a model or ring change applied with
// other bytes than the leader's). The follower refuses to start; moving its
// raft directory aside, as the message says, brings it back with the
// leader's metadata.
func TestRaftLogBitFlipRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts processes")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	procs, _, victim, vdir := startMetaCluster(ctx, t)
	fps := registerRevs(t, ctx, procs[0], "rev-flipped-old-entry", "rev-later-1", "rev-later-2")
	testutil.WaitFor(t, victim.ID()+" to apply every model", func() bool {
		models, _, _, err := nodeView(ctx, victim.Addr("grpc"))
		return err == nil && len(models) == len(fps)
	})
	if err := victim.Terminate(30 * time.Second); err != nil {
		t.Fatalf("SIGTERM %s: %v", victim.ID(), err)
	}
	flipMarker(t, filepath.Join(vdir, "raft", "wal", "*.wal"), "rev-flipped-old-entry")

	wantRefused(t, ctx, victim, vdir, "raft log")

	raftDir := filepath.Join(vdir, "raft")
	if err := os.Rename(raftDir, raftDir+".damaged"); err != nil {
		t.Fatal(err)
	}
	if err := victim.Start(ctx); err != nil {
		t.Fatalf("%s after its raft state was moved aside: %v", victim.ID(), err)
	}
	waitReady(t, ctx, victim)
	var want []string
	for _, fp := range fps {
		want = append(want, fp.String())
	}
	slices.Sort(want)
	testutil.WaitFor(t, victim.ID()+" to hold the leader's models and epoch", func() bool {
		models, leader, epoch, err := nodeView(ctx, victim.Addr("grpc"))
		if err != nil || leader == "" || !slices.Equal(models, want) {
			return false
		}
		_, _, lepoch, err := nodeView(ctx, procs[0].Addr("grpc"))
		return err == nil && epoch == lepoch
	})
}

// TestRaftLogTruncatedRefused cuts the raft log of a stopped node short
// in the middle of an entry: raft-wal alone takes that for a write torn
// by a crash and starts without the entries after the cut.
func TestRaftLogTruncatedRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts processes")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	p, dir := soloStopped(t, ctx, "rev-kept", "rev-cut-here", "rev-lost")
	segs, _ := filepath.Glob(filepath.Join(dir, "raft", "wal", "*.wal"))
	var cut bool
	for _, f := range segs {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if i := bytes.Index(b, []byte("rev-cut-here")); i >= 0 {
			if err := os.Truncate(f, int64(i)); err != nil {
				t.Fatal(err)
			}
			cut = true
		}
	}
	if !cut {
		t.Fatalf("entry not found in %v", segs)
	}
	wantRefused(t, ctx, p, dir, "raft log")
}

// TestRaftSnapshotDamagedRefused flips a bit in the newest snapshot of a
// node that has two: raft alone would restore the older one.
func TestRaftSnapshotDamagedRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts processes")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	p, dir := soloStopped(t, ctx, "rev-first-snapshot")
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	registerRevs(t, ctx, p, "rev-second-snapshot")
	if err := p.Terminate(30 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	snaps, _ := filepath.Glob(filepath.Join(dir, "raft", "snapshots", "*", "state.bin"))
	if len(snaps) < 2 {
		t.Fatalf("want two snapshots, have %v", snaps)
	}
	flipMarker(t, snaps[len(snaps)-1], "rev-second-snapshot")
	wantRefused(t, ctx, p, dir, filepath.Dir(snaps[len(snaps)-1]))
}

// TestWALMetaDamagedRefused damages raft-wal's bolt meta store: bbolt
// panics on a page of no known type ("invalid page type").
func TestWALMetaDamagedRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts processes")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	p, dir := soloStopped(t, ctx, "rev-meta")
	path := filepath.Join(dir, "raft", "wal", "wal-meta.db")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const pageSize = 4096 // bbolt's on this file system
	for off := 2 * pageSize; off+pageSize <= len(b); off += pageSize {
		b[off+8], b[off+9] = 0, 0 // page flags: no page type
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, ctx, p, dir, path)
}

// TestRingDisagreementNotReady gives a follower a ring that differs from
// the leader's at the same epoch, as a log written before entries had
// checksums (read unchecked) with a flipped bit in a ring change would:
// the follower, killed, gets a weight in its last ring-change entry
// changed, that entry's checksum tag broken and the first checksummed
// index moved past it. Restarted, it must not become ready, and its state
// (what `kvmesh status` and `kvmesh ring` print) says how the rings
// differ. Moving its raft directory aside brings it back.
func TestRingDisagreementNotReady(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts processes")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	procs, c, victim, vdir := startMetaCluster(ctx, t)
	for _, p := range procs {
		waitReady(t, ctx, p)
	}
	// An entry after the ring change: raft-wal checks the last batch of
	// its log, and drops it as torn when it fails.
	registerRevs(t, ctx, procs[0], "rev-after-the-ring")
	testutil.WaitFor(t, victim.ID()+" to apply the model", func() bool {
		models, _, _, err := nodeView(ctx, victim.Addr("grpc"))
		return err == nil && len(models) == 1
	})
	victim.Kill() // no snapshot: the restart applies its log again
	<-victim.Exited()

	segs, _ := filepath.Glob(filepath.Join(vdir, "raft", "wal", "*.wal"))
	if len(segs) != 1 {
		t.Fatalf("want one log segment, have %v", segs)
	}
	b, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	w := bytes.LastIndex(b, []byte(`"weight":`))
	if w < 0 {
		t.Fatal("no ring change with a weight in the log")
	}
	w += len(`"weight":`)
	b[w] ^= 0x01 // 0.03125 -> 1.03125
	if tag := bytes.Index(b[w:], []byte("kvc\x01")); tag >= 0 {
		b[w+tag] ^= 0x01
	}
	if err := os.WriteFile(segs[0], b, 0o644); err != nil {
		t.Fatal(err)
	}
	setStable(t, filepath.Join(vdir, "raft", "wal", "wal-meta.db"), "kvmesh_entry_checksums_from", 1<<62)

	if err := victim.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var state string
	testutil.WaitFor(t, victim.ID()+" to report the ring difference", func() bool {
		_, st, err := c.StatsAndState(ctx, victim.Addr("grpc"))
		state = st
		return err == nil && strings.Contains(st, "ring differs from the leader's")
	})
	t.Logf("%s: %s", victim.ID(), state)
	if !strings.HasPrefix(state, "recovering") || !strings.Contains(state, "1.03125 here, 0.03125 on the leader") {
		t.Fatalf("%s's state %q, want recovering with the weights that differ", victim.ID(), state)
	}
	if code, _, err := readyz(ctx, victim.Addr("http")); err != nil || code == 200 {
		t.Fatalf("%s: /readyz %d %v while its ring differs", victim.ID(), code, err)
	}

	if err := victim.Terminate(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	raftDir := filepath.Join(vdir, "raft")
	if err := os.Rename(raftDir, raftDir+".damaged"); err != nil {
		t.Fatal(err)
	}
	if err := victim.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ctx, victim)
}

// setStable sets key to v in the stable bucket of raft-wal's bolt meta
// store at path, as raft-wal's SetUint64 writes it.
func setStable(t *testing.T, path, key string, v uint64) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte("stable"))
		if b == nil {
			return errors.New("no stable bucket")
		}
		return b.Put([]byte(key), binary.LittleEndian.AppendUint64(nil, v))
	}); err != nil {
		t.Fatal(err)
	}
}
