package meta

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

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

// TestHCLogAdapterAttrs: raft's value wrappers are rendered, not leaked as
// their format and arguments, and a derived logger carries each attribute
// once however it was derived.
func TestHCLogAdapterAttrs(t *testing.T) {
	var buf bytes.Buffer
	l := newHCLog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})), "raft")
	type server struct{ ID, Address string }
	l.Info("initial configuration", "index", 1, "servers", hclog.Fmt("%+v", []server{{"n1", "127.0.0.1:7000"}}))
	l.Info("wrappers", "hex", hclog.Hex(255), "octal", hclog.Octal(8), "binary", hclog.Binary(5), "quote", hclog.Quote("a b"),
		"empty", hclog.Format{})
	l.Info("odd", "key", "value", "dangling")
	l.Info("entering candidate state", "node", "Node at 127.0.0.1:7000 [Candidate]", "time", time.Second)
	l.Named("net").Named("pipe").With("peer", "n2").With("peer", "n3", "term", 4).Warn("heartbeat failed")
	l.ResetNamed("raft").With("peer", "n2").Info("reset")
	out := buf.String()
	for _, want := range []string{
		`msg="initial configuration" component=raft index=1 servers="[{ID:n1 Address:127.0.0.1:7000}]"`,
		`msg=wrappers component=raft hex=0xff octal=010 binary=0b101 quote="\"a b\"" empty=""`,
		`msg=odd component=raft key=value EXTRA_VALUE_AT_END=dangling`,
		`msg="entering candidate state" component=raft raft.node="Node at 127.0.0.1:7000 [Candidate]" raft.time=1s`,
		`msg="heartbeat failed" component=raft subsystem=raft.net.pipe peer=n3 term=4` + "\n",
		`msg=reset component=raft peer=n2` + "\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "%+v") {
		t.Errorf("a format string leaked:\n%s", out)
	}
}

// TestHCLogAdapterJSON: a value raft formats with its String method (its
// raft state, a duration) shows that way in JSON too, not as the struct's
// exported fields.
func TestHCLogAdapterJSON(t *testing.T) {
	var buf bytes.Buffer
	l := newHCLog(slog.New(slog.NewJSONHandler(&buf, nil)), "raft")
	l.Info("entering follower state", "follower", stringer{Hidden: 1}, "wait", 1500*time.Millisecond)
	if want := `"follower":"Node at n1 [Follower]","wait":"1.5s"`; !strings.Contains(buf.String(), want) {
		t.Errorf("log lacks %s:\n%s", want, buf.String())
	}
}

type stringer struct{ Hidden int }

func (stringer) String() string { return "Node at n1 [Follower]" }
