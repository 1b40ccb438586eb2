package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLogFormat: -log-format json makes the node's logger write one JSON
// object a line, text is the default, anything else is a usage error.
func TestLogFormat(t *testing.T) {
	base := FileConfig{ID: "x", DataDir: t.TempDir(), LogLevel: "info", DRAM: "1G", Disk: "0", DeadGrace: "1s", RaftRemoveAfter: "1m", Bootstrap: true, RPCTimeout: "1s"}
	for _, format := range []string{"", "text", "json"} {
		fc := base
		fc.LogFormat = format
		var buf bytes.Buffer
		cfg, err := fc.Config(&buf)
		if err != nil {
			t.Fatalf("format %q: %v", format, err)
		}
		cfg.Logger.Info("hello", "node", "x")
		var rec map[string]any
		isJSON := json.Unmarshal(buf.Bytes(), &rec) == nil
		if isJSON != (format == "json") || !strings.Contains(buf.String(), "hello") {
			t.Errorf("format %q wrote %q", format, buf.String())
		}
		if isJSON && (rec["msg"] != "hello" || rec["node"] != "x" || rec["level"] != "INFO") {
			t.Errorf("json record %v", rec)
		}
	}
	fc := base
	fc.LogFormat = "logfmt"
	if _, err := fc.Config(&bytes.Buffer{}); !errors.Is(err, ErrUsage) {
		t.Errorf("-log-format logfmt: %v, want ErrUsage", err)
	}
	if _, err := parseArgs([]string{"-log-format", "json", "-audit-log", "-"}, &bytes.Buffer{}); err != nil {
		t.Errorf("flags: %v", err)
	}
}

// TestAuditLog: -audit-log names a file appended to (mode 0600) or "-"
// for stderr, in the log format; without it there is no audit logger.
func TestAuditLog(t *testing.T) {
	var stderr bytes.Buffer
	if log, closeFn, err := (FileConfig{}).openAuditLog(&stderr); err != nil || log != nil || closeFn() != nil {
		t.Fatalf("no -audit-log: %v %v", log, err)
	}
	log, closeFn, err := (FileConfig{AuditLog: "-", LogFormat: "json"}).openAuditLog(&stderr)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("audit", "method", "m")
	if err := closeFn(); err != nil || !json.Valid(stderr.Bytes()) {
		t.Fatalf("audit to stderr: %q, %v", stderr.String(), err)
	}
	path := filepath.Join(t.TempDir(), "audit.log")
	for i := range 2 {
		log, closeFn, err := (FileConfig{AuditLog: path}).openAuditLog(&stderr)
		if err != nil {
			t.Fatal(err)
		}
		log.Info("audit", "i", i)
		if err := closeFn(); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "msg=audit"); n != 2 {
		t.Errorf("audit file holds %d records, want 2 (appended):\n%s", n, b)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("audit file mode %v, %v", fi.Mode(), err)
	}
}
