package meta

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

func TestHCLogAdapter(t *testing.T) {
	var buf bytes.Buffer
	l := newHCLog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})), "raft")
	l.Debug("hidden")
	l.Info("entering follower state", "term", 3)
	l.Named("net").With("peer", "n2").Warn("heartbeat failed")
	l.StandardLogger(nil).Printf("[ERR] raft-net: accept failed")
	l.StandardLogger(nil).Printf("[DEBUG] also hidden")
	out := buf.String()
	for _, want := range []string{
		`level=INFO msg="entering follower state" component=raft term=3`,
		`level=WARN msg="heartbeat failed" component=raft subsystem=raft.net peer=n2`,
		`level=ERROR msg="raft-net: accept failed"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "hidden") {
		t.Errorf("debug lines passed an info handler:\n%s", out)
	}
	if l.IsDebug() || !l.IsInfo() || l.GetLevel() != hclog.Info {
		t.Errorf("levels: debug %v info %v level %v", l.IsDebug(), l.IsInfo(), l.GetLevel())
	}
	if l.Named("x").Name() != "raft.x" || l.ResetNamed("y").Name() != "y" {
		t.Error("names")
	}
}
