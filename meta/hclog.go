package meta

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// slogHCLog adapts a *slog.Logger to the hclog.Logger that raft and raft-wal
// take, so the whole process logs through one handler. Levels map one to one
// (hclog Trace becomes slog Debug-4) and the handler decides what is shown.
// hclog's value wrappers (hclog.Fmt, Hex, Quote...) are rendered as hclog
// renders them, not passed on as their raw parts, and a logger derived with
// Named, ResetNamed or With carries each attribute once.
type slogHCLog struct {
	base *slog.Logger // the logger given, with the component
	comp string       // the component: the name newHCLog was given
	name string
	args []any // implied arguments (With), rendered, one value per key
	l    *slog.Logger
}

func newHCLog(l *slog.Logger, name string) hclog.Logger {
	base := l.With("component", name)
	return &slogHCLog{base: base, comp: name, name: name, l: base}
}

// derive returns a logger named name with implied arguments args: the
// subsystem (when it is not the component itself) and args are added once
// to the base logger, never on top of an earlier derivation's.
func (h *slogHCLog) derive(name string, args []any) *slogHCLog {
	l := h.base
	if name != h.comp {
		l = l.With("subsystem", name)
	}
	if len(args) > 0 {
		l = l.With(args...)
	}
	return &slogHCLog{base: h.base, comp: h.comp, name: name, args: args, l: l}
}

// hclogArgs renders hclog's value wrappers as hclog's own formatter does:
// hclog.Fmt's format and arguments through fmt.Sprintf, Hex, Octal and
// Binary as numbers with their prefix, Quote quoted, any other
// fmt.Stringer but an error by its String. A missing last value
// becomes hclog's EXTRA_VALUE_AT_END key. A key the process's records
// already carry (slog's time, level, msg, source; node, component,
// subsystem) is prefixed with the component ("raft.node"), so a record
// never holds one key twice (raft logs its own "node" and a "time").
func hclogArgs(comp string, args []any) []any {
	if len(args) == 0 {
		return nil
	}
	out := make([]any, 0, len(args)+1)
	if len(args)%2 == 1 {
		args = append(args[:len(args)-1:len(args)-1], hclog.MissingKey, args[len(args)-1])
	}
	for i := 0; i < len(args); i += 2 {
		k, v := args[i], args[i+1]
		ks, ok := k.(string)
		if !ok {
			ks = fmt.Sprint(k)
		}
		switch ks {
		case slog.TimeKey, slog.LevelKey, slog.MessageKey, slog.SourceKey, "node", "component", "subsystem":
			ks = comp + "." + ks
		}
		k = ks
		switch st := v.(type) {
		case hclog.Format:
			v = fmt.Sprint([]any(st)...)
			if len(st) > 0 {
				if f, ok := st[0].(string); ok {
					v = fmt.Sprintf(f, st[1:]...)
				}
			}
		case hclog.Hex:
			v = "0x" + strconv.FormatUint(uint64(st), 16)
		case hclog.Octal:
			v = "0" + strconv.FormatUint(uint64(st), 8)
		case hclog.Binary:
			v = "0b" + strconv.FormatUint(uint64(st), 2)
		case hclog.Quote:
			v = strconv.Quote(string(st))
		case error:
		case fmt.Stringer:
			// As hclog prints it (raft's "Node at ADDR [Follower]"); a JSON
			// handler would show only its exported fields.
			v = st.String()
		}
		out = append(out, k, v)
	}
	return out
}

// mergeArgs returns the implied arguments prev with next's added, a key
// given again taking its new value in place.
func mergeArgs(prev, next []any) []any {
	out := append([]any(nil), prev...)
outer:
	for i := 0; i+1 < len(next); i += 2 {
		for j := 0; j+1 < len(out); j += 2 {
			if out[j] == next[i] {
				out[j+1] = next[i+1]
				continue outer
			}
		}
		out = append(out, next[i], next[i+1])
	}
	return out
}

func slogLevel(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	}
	return slog.LevelInfo
}

func (h *slogHCLog) Log(level hclog.Level, msg string, args ...any) {
	lv := slogLevel(level)
	ctx := context.Background()
	if !h.l.Enabled(ctx, lv) {
		return
	}
	h.l.Log(ctx, lv, msg, hclogArgs(h.comp, args)...)
}

func (h *slogHCLog) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *slogHCLog) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *slogHCLog) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *slogHCLog) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *slogHCLog) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }

func (h *slogHCLog) enabled(level hclog.Level) bool {
	return h.l.Enabled(context.Background(), slogLevel(level))
}

func (h *slogHCLog) IsTrace() bool { return h.enabled(hclog.Trace) }
func (h *slogHCLog) IsDebug() bool { return h.enabled(hclog.Debug) }
func (h *slogHCLog) IsInfo() bool  { return h.enabled(hclog.Info) }
func (h *slogHCLog) IsWarn() bool  { return h.enabled(hclog.Warn) }
func (h *slogHCLog) IsError() bool { return h.enabled(hclog.Error) }

func (h *slogHCLog) ImpliedArgs() []any { return h.args }

func (h *slogHCLog) With(args ...any) hclog.Logger {
	return h.derive(h.name, mergeArgs(h.args, hclogArgs(h.comp, args)))
}

func (h *slogHCLog) Name() string { return h.name }

func (h *slogHCLog) Named(name string) hclog.Logger {
	if h.name != "" {
		name = h.name + "." + name
	}
	return h.derive(name, h.args)
}

func (h *slogHCLog) ResetNamed(name string) hclog.Logger {
	return h.derive(name, h.args)
}

// SetLevel is a no-op: the slog handler owns the level.
func (h *slogHCLog) SetLevel(hclog.Level) {}

func (h *slogHCLog) GetLevel() hclog.Level {
	for _, lv := range []hclog.Level{hclog.Trace, hclog.Debug, hclog.Info, hclog.Warn} {
		if h.enabled(lv) {
			return lv
		}
	}
	return hclog.Error
}

func (h *slogHCLog) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(opts), "", 0)
}

func (h *slogHCLog) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return stdWriter{h}
}

// stdWriter turns lines of the standard logger, which raft's transport
// still uses in places, into slog records, taking the level from the
// "[WARN]"-style prefix when there is one.
type stdWriter struct{ h *slogHCLog }

func (w stdWriter) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	level := hclog.Info
	for _, c := range []struct {
		tag string
		lv  hclog.Level
	}{{"[TRACE]", hclog.Trace}, {"[DEBUG]", hclog.Debug}, {"[INFO]", hclog.Info}, {"[WARN]", hclog.Warn}, {"[ERR]", hclog.Error}, {"[ERROR]", hclog.Error}} {
		if rest, ok := strings.CutPrefix(msg, c.tag); ok {
			level, msg = c.lv, strings.TrimSpace(rest)
			break
		}
	}
	w.h.Log(level, msg)
	return len(p), nil
}
