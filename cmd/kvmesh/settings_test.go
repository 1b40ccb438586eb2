package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/meta"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/nodetest"
)

// TestSettingsCommand runs `kvmesh settings` against an in-process node
// with tokens: refused without an admin token, get shows the defaults,
// set changes only the given fields (visible in the node's metadata), and
// invalid values are refused with InvalidArgument, changing nothing.
func TestSettingsCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	nd := nodetest.Start(t, 1, nodetest.Config{Node: func(_ int, cfg *node.Config) { cfg.Tokens = true }}).Nodes[0]
	token := func(name string, scopes auth.Scope) string {
		tok, rec, err := auth.NewToken(name, scopes, nil, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if err := nd.Meta().PutToken(ctx, rec); err != nil {
			t.Fatal(err)
		}
		return tok.String()
	}
	root, reader := token("root", auth.ScopeRead|auth.ScopeWrite|auth.ScopeAdmin), token("reader", auth.ScopeRead|auth.ScopeWrite)
	run1 := func(tok string, args ...string) (string, error) {
		var out bytes.Buffer
		base := []string{"-addr", nd.GRPCAddr(), "-insecure"}
		if tok != "" {
			base = append(base, "-token", tok)
		}
		err := run(ctx, append(base, args...), &out, io.Discard)
		return out.String(), err
	}

	for _, tc := range []struct {
		name, tok string
		args      []string
		out       string // a line the output must hold
		errHas    string // "": success
		want      meta.Settings
	}{
		{"no token", "", []string{"settings"}, "", "Unauthenticated", meta.DefaultSettings()},
		{"no admin scope", reader, []string{"settings", "set", "-r", "1"}, "", "PermissionDenied", meta.DefaultSettings()},
		{"get defaults", root, []string{"settings"}, "R=3 W=2 codec=lossless", "", meta.DefaultSettings()},
		{"set all", root, []string{"settings", "set", "-r", "1", "-w", "1", "-codec", "lossless"}, "now R=1 W=1 codec=lossless", "",
			meta.Settings{ReplicationFactor: 1, WriteQuorum: 1, Codec: chunk.CodecLossless}},
		{"W above R", root, []string{"settings", "set", "-w", "2"}, "", "InvalidArgument",
			meta.Settings{ReplicationFactor: 1, WriteQuorum: 1, Codec: chunk.CodecLossless}},
		{"R above 16", root, []string{"settings", "set", "-r", "17"}, "", "InvalidArgument",
			meta.Settings{ReplicationFactor: 1, WriteQuorum: 1, Codec: chunk.CodecLossless}},
		{"unknown codec", root, []string{"settings", "set", "-codec", "zstd"}, "", "InvalidArgument",
			meta.Settings{ReplicationFactor: 1, WriteQuorum: 1, Codec: chunk.CodecLossless}},
		{"nothing to set", root, []string{"settings", "set"}, "", "nothing to change",
			meta.Settings{ReplicationFactor: 1, WriteQuorum: 1, Codec: chunk.CodecLossless}},
		{"set R only", root, []string{"settings", "set", "-r", "3"}, "was R=1 W=1 codec=lossless", "",
			meta.Settings{ReplicationFactor: 3, WriteQuorum: 1, Codec: chunk.CodecLossless}},
		{"get after set", root, []string{"settings", "get"}, "R=3 W=1 codec=lossless", "",
			meta.Settings{ReplicationFactor: 3, WriteQuorum: 1, Codec: chunk.CodecLossless}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run1(tc.tok, tc.args...)
			switch {
			case tc.errHas == "" && err != nil:
				t.Fatalf("%v: %v", tc.args, err)
			case tc.errHas != "" && (err == nil || !strings.Contains(err.Error(), tc.errHas)):
				t.Fatalf("%v: err %v, want %q", tc.args, err, tc.errHas)
			}
			if !strings.Contains(out, tc.out) {
				t.Errorf("%v: output %q lacks %q", tc.args, out, tc.out)
			}
			if got := nd.Meta().Settings(); got != tc.want {
				t.Errorf("%v: settings %+v, want %+v", tc.args, got, tc.want)
			}
		})
	}
}
