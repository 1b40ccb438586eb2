package daemon

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvmesh/kvmesh/gossip/gossipkey"
	"github.com/kvmesh/kvmesh/node"
)

// FuzzDaemonConfig fuzzes kvmeshd's configuration: the JSON file, and the
// gossip keyring, tokens and TLS files it names (their paths replaced by
// files holding the fuzzed bytes), down to node.New.
func FuzzDaemonConfig(f *testing.F) {
	key, err := gossipkey.Generate()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(`{"id":"a","data_dir":"d","insecure":true,"dram":"64M","gossip_keyring_file":"k","auth":{"tokens":true,"tokens_file":"t"}}`,
		gossipkey.Encode(key)+"\n", recordLine(f))
	f.Add(`{"tls":{"ca_file":"c","cert_file":"c","key_file":"c"},"data_dir":"d","dead_grace":"1s","rpc_timeout":"-1s","anti_entropy":"off"}`,
		"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "")
	f.Add(`{"join":["x:1"],"bootstrap_expect":-3,"disk":"1T","log_level":"debug","auth":{"max_streams_per_client":-1}}`, "", "{}")
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, conf, keyring, tokens string) {
		tmp := t.TempDir()
		write := func(name, data string) string {
			p := filepath.Join(tmp, name)
			if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
				t.Fatal(err)
			}
			return p
		}
		fc := FileConfig{DRAM: "1G", Disk: "0", DeadGrace: "30s", RaftRemoveAfter: "1m", Bootstrap: true, RPCTimeout: "10s", LogLevel: "info", AntiEntropy: "5m"}
		fc.GRPC = node.DefaultGRPCAddr
		if err := mergeFile(write("config.json", conf), &fc, map[string]bool{}); err != nil {
			return
		}
		// Every named file holds fuzzed bytes; no path leaves tmp.
		fc.DataDir = filepath.Join(dir, "data")
		if fc.GossipKeyringFile != "" {
			fc.GossipKeyringFile = write("gossip.keys", keyring)
		}
		if fc.Auth.TokensFile != "" {
			fc.Auth.TokensFile = write("tokens.jsonl", tokens)
		}
		for _, p := range []*string{&fc.TLS.CAFile, &fc.TLS.CertFile, &fc.TLS.KeyFile} {
			if *p != "" {
				*p = write("pem", keyring)
			}
		}
		cfg, err := fc.Config(io.Discard)
		if err != nil {
			return
		}
		if _, err := fc.tokenRecords(); err != nil {
			return
		}
		// New checks and loads everything but binds nothing.
		_, _ = node.New(cfg)
	})
}
