package gossip

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strings"
)

// metaDelegate is memberlist's Delegate: it only supplies our metadata.
type metaDelegate Gossip

// NodeMeta implements memberlist.Delegate.
func (d *metaDelegate) NodeMeta(limit int) []byte {
	d.metaMu.Lock()
	defer d.metaMu.Unlock()
	if len(d.metaB) > limit {
		return nil // cannot happen: MarshalBinary enforces MetaMaxSize
	}
	return slices.Clone(d.metaB)
}

// NotifyMsg implements memberlist.Delegate: it queues leave notices for
// drain (Gossip.applyLeaveNotice).
func (d *metaDelegate) NotifyMsg(b []byte) {
	if len(b) < 2 || b[0] != msgLeaving {
		return
	}
	d.queue.push(queuedEvent{notice: string(b[1:])})
}

// GetBroadcasts implements memberlist.Delegate.
func (d *metaDelegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }

// LocalState implements memberlist.Delegate.
func (d *metaDelegate) LocalState(join bool) []byte { return nil }

// MergeRemoteState implements memberlist.Delegate.
func (d *metaDelegate) MergeRemoteState(buf []byte, join bool) {}

// slogWriter turns memberlist's "[LEVEL] memberlist: msg" lines into slog
// records at that level.
type slogWriter struct{ log *slog.Logger }

func (w *slogWriter) Write(p []byte) (int, error) {
	line := string(bytes.TrimRight(p, "\n"))
	level := slog.LevelInfo
	for _, l := range []struct {
		tag   string
		level slog.Level
	}{
		{"[DEBUG]", slog.LevelDebug}, {"[INFO]", slog.LevelInfo},
		{"[WARN]", slog.LevelWarn}, {"[ERR]", slog.LevelError}, {"[ERROR]", slog.LevelError},
	} {
		if rest, ok := strings.CutPrefix(line, l.tag); ok {
			level, line = l.level, strings.TrimSpace(rest)
			break
		}
	}
	line = strings.TrimPrefix(line, "memberlist: ")
	w.log.Log(context.Background(), level, line)
	return len(p), nil
}
