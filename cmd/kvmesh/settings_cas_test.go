package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/meta"
	"github.com/kvmesh/kvmesh/node/nodetest"
)

// TestSettingsIfVersion: `settings get` shows the version, `settings set
// -if-version V` changes the settings only while they are at V: a stale V
// is refused with FailedPrecondition and changes nothing.
func TestSettingsIfVersion(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	nd := nodetest.Start(t, 1, nodetest.Config{}).Nodes[0]
	run1 := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(ctx, append([]string{"-addr", nd.GRPCAddr(), "-insecure"}, args...), &out, io.Discard)
		return out.String(), err
	}
	// version reads the version= field of the last line of `settings get`.
	version := func() uint64 {
		t.Helper()
		out, err := run1("settings", "get")
		if err != nil {
			t.Fatal(err)
		}
		_, v, ok := strings.Cut(strings.TrimSpace(out), "version=")
		n, perr := strconv.ParseUint(v, 10, 64)
		if !ok || perr != nil {
			t.Fatalf("settings get printed %q: no version", out)
		}
		if _, mv := nd.Meta().VersionedSettings(); mv != n {
			t.Fatalf("printed version %d, node holds %d", n, mv)
		}
		return n
	}
	v0 := version()
	if _, err := run1("settings", "set", "-r", "2", "-w", "1", "-if-version", fmt.Sprint(v0)); err != nil {
		t.Fatalf("set at the version read: %v", err)
	}
	v1 := version()
	if v1 <= v0 {
		t.Fatalf("version %d after a change, was %d", v1, v0)
	}
	want := meta.Settings{ReplicationFactor: 2, WriteQuorum: 1, Codec: meta.DefaultSettings().Codec}
	_, err := run1("settings", "set", "-codec", "int8", "-if-version", fmt.Sprint(v0))
	if err == nil || !strings.Contains(err.Error(), "FailedPrecondition") {
		t.Fatalf("set at a stale version: %v, want FailedPrecondition", err)
	}
	if got := nd.Meta().Settings(); got != want || version() != v1 {
		t.Fatalf("a refused change changed the settings: %+v", got)
	}
	out, err := run1("settings", "set", "-codec", "int8", "-if-version", fmt.Sprint(v1))
	if err != nil {
		t.Fatal(err)
	}
	want.Codec = chunk.CodecInt8
	if got := nd.Meta().Settings(); got != want || !strings.Contains(out, "now R=2 W=1 codec=int8 version=") {
		t.Fatalf("settings %+v, output %q", got, out)
	}
}
