package node

import (
	"testing"
)

func TestNewRefusesWithoutTLS(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{name: "neither", cfg: Config{NodeID: "a", DataDir: t.TempDir()}},
		{name: "insecure", cfg: Config{NodeID: "a", DataDir: t.TempDir(), Insecure: true}, ok: true},
		{name: "missing files", cfg: Config{NodeID: "a", DataDir: t.TempDir()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "missing files" {
				tc.cfg.TLS.CAFile = "/nonexistent/ca.pem"
			}
			_, err := New(tc.cfg)
			if (err == nil) != tc.ok {
				t.Fatalf("New: %v", err)
			}
		})
	}
}
