package daemon

import (
	"fmt"
	"io"
	"log/slog"
	"os"
)

// newLogger is kvmeshd's one way to build a logger, for its log and its
// audit log alike: format "text" (the default, also "") or "json" (one
// JSON object a line, slog's field names: time, level, msg, then the
// attributes), records below level dropped.
func newLogger(w io.Writer, format string, level slog.Level) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "", "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("%w: -log-format %q: want text or json", ErrUsage, format)
}

// openAuditLog builds the audit logger -audit-log names: "" none, "-"
// stderr, else the file at path, appended to (created with mode 0600).
// close releases the file.
func (fc FileConfig) openAuditLog(stderr io.Writer) (log *slog.Logger, close func() error, err error) {
	close = func() error { return nil }
	var w io.Writer
	switch fc.AuditLog {
	case "":
		return nil, close, nil
	case "-":
		w = stderr
	default:
		f, err := os.OpenFile(fc.AuditLog, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return nil, close, fmt.Errorf("kvmeshd: -audit-log: %w", err)
		}
		w, close = f, f.Close
	}
	// Every audit record is written, whatever -log-level says.
	log, err = newLogger(w, fc.LogFormat, slog.LevelInfo)
	if err != nil {
		_ = close()
		return nil, func() error { return nil }, err
	}
	return log, close, nil
}
