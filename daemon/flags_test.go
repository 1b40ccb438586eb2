package daemon

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

// TestOffFlags: every kvmeshd setting that takes a quantity or "off"
// reads "", "off", "0", a value and garbage as its help text says.
func TestOffFlags(t *testing.T) {
	const refused = int64(-999) // want: an error
	for _, tc := range []struct {
		flag offFlag
		in   string
		want int64
	}{
		// -dram-release: off is -1 (kvtier: never release); 0 refused.
		{dramReleaseFlag(), "", 0},
		{dramReleaseFlag(), "off", -1},
		{dramReleaseFlag(), " off ", -1},
		{dramReleaseFlag(), "0", refused},
		{dramReleaseFlag(), "16M", 16 << 20},
		{dramReleaseFlag(), "-1", refused},
		{dramReleaseFlag(), "1s", refused},
		{dramReleaseFlag(), "OFF", refused},

		// -anti-entropy: off is -1 (no rounds); 0 is the default.
		{antiEntropyFlag(), "", 0},
		{antiEntropyFlag(), "0", 0},
		{antiEntropyFlag(), "off", -1},
		{antiEntropyFlag(), "30s", int64(30 * time.Second)},
		{antiEntropyFlag(), "-1s", refused},
		{antiEntropyFlag(), "30", refused},
		{antiEntropyFlag(), "soon", refused},

		// -rebalance-rate: off is -1 (unlimited); 0 refused.
		{rebalanceRateFlag(), "", 0},
		{rebalanceRateFlag(), "off", -1},
		{rebalanceRateFlag(), "0", refused},
		{rebalanceRateFlag(), "64M", 64 << 20},
		{rebalanceRateFlag(), "fast", refused},

		// -rebalance-recv-rate: off is 0 (replication: uncapped); 0 refused.
		{rebalanceRecvRateFlag(), "", 0},
		{rebalanceRecvRateFlag(), "off", 0},
		{rebalanceRecvRateFlag(), "0", refused},
		{rebalanceRecvRateFlag(), "200M", 200 << 20},
		{rebalanceRecvRateFlag(), "-1M", refused},

		// -peer-link-rate: off is 0 (node: no pacing); 0 refused.
		{peerLinkRateFlag(), "", 0},
		{peerLinkRateFlag(), "off", 0},
		{peerLinkRateFlag(), "0", refused},
		{peerLinkRateFlag(), "125000000", 125000000},
		{peerLinkRateFlag(), "-1M", refused},

		// -rebalance-yield: off is -1 (no waiting); 0 is off.
		{rebalanceYieldFlag(), "", 0},
		{rebalanceYieldFlag(), "off", -1},
		{rebalanceYieldFlag(), "0", -1},
		{rebalanceYieldFlag(), "100ms", int64(100 * time.Millisecond)},
		{rebalanceYieldFlag(), "-5ms", refused},
	} {
		t.Run(tc.flag.name+"="+tc.in, func(t *testing.T) {
			got, err := tc.flag.parse(tc.in)
			if tc.want == refused {
				if err == nil || !errors.Is(err, errOffFlag) || !strings.Contains(err.Error(), "-"+tc.flag.name) {
					t.Fatalf("parse(%q) = %d, %v; want an errOffFlag naming -%s", tc.in, got, err, tc.flag.name)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parse(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
			}
		})
	}
}

// TestOffFlagsHelp: kvmeshd's help text states, for each such flag, what
// "off" and "0" mean.
func TestOffFlagsHelp(t *testing.T) {
	var help strings.Builder
	err := Run(t.Context(), []string{"-h"}, io.Discard, &help)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	for _, tc := range []struct {
		flag      offFlag
		off, zero string
	}{
		{dramReleaseFlag(), `"off": never`, `"0" is refused`},
		{antiEntropyFlag(), `"off": no rounds`, `"0" is the default`},
		{rebalanceRateFlag(), `"off": unlimited`, `"0" is refused`},
		{rebalanceRecvRateFlag(), `"off": uncapped`, `"0" is refused`},
		{rebalanceYieldFlag(), `"off": no waiting`, `"0" is "off"`},
	} {
		// flag prints "  -name value\n    \tusage (default ...)".
		_, text, ok := strings.Cut(help.String(), "  -"+tc.flag.name+" ")
		if !ok {
			t.Fatalf("-%s missing from the help:\n%s", tc.flag.name, help.String())
		}
		text, _, _ = strings.Cut(text, "\n  -")
		if !strings.Contains(text, tc.off) || !strings.Contains(text, tc.zero) {
			t.Errorf("-%s help %q lacks %q or %q", tc.flag.name, text, tc.off, tc.zero)
		}
	}
}

// TestFlagRefusals: a flag value without a documented meaning is refused
// as a usage error (kvmeshd exits 2), never replaced by a default.
func TestFlagRefusals(t *testing.T) {
	dir := t.TempDir()
	base := []string{"-data-dir", dir, "-insecure", "-id", "n1"}
	for _, tc := range []struct {
		args []string
		want string // a substring of the error
	}{
		{nil, "no -bootstrap, -bootstrap-expect or -join"},
		{[]string{"-bootstrap-expect", "0"}, "no -bootstrap, -bootstrap-expect or -join"},
		{[]string{"-bootstrap", "-join", "h:7401"}, "takes no -join"},
		{[]string{"-bootstrap-expect", "1", "-join", "h:7401"}, "takes no -join"},
		{[]string{"-bootstrap", "-bootstrap-expect", "3"}, "-bootstrap is -bootstrap-expect 1"},
		{[]string{"-bootstrap", "-raft-remove-after", "0"}, "-raft-remove-after"},
		{[]string{"-bootstrap", "-grpc", "nohost"}, "-grpc"},
		{[]string{"-bootstrap", "-grpc", "h:99999"}, "-grpc"},
		{[]string{"-bootstrap", "-raft", "h:x"}, "-raft"},
		{[]string{"-bootstrap", "-http", "on"}, "-http"},
		{[]string{"-bootstrap", "-dram", "0"}, "-dram 0"},
		{[]string{"-bootstrap", "-dram", "lots"}, "-dram"},
		{[]string{"-bootstrap", "-admission", "lru"}, "-admission"},
		{[]string{"-join", "seedhost"}, `-join "seedhost"`},
		{[]string{"-join", "h:7401,h:0"}, `-join "h:0"`},
		{[]string{"-bootstrap", "-disk", "-1G"}, "-disk"},
		{[]string{"-bootstrap", "-log-level", "loud"}, "-log-level"},
		{[]string{"-bootstrap", "-max-chunks-per-request", "-5"}, "-max-chunks-per-request -5"},
		{[]string{"-bootstrap", "-config", "/nonexistent/kvmeshd.json"}, "-config"},
		{[]string{"-bootstrap", "-rpc-timeout", "0"}, "-rpc-timeout"},
		{[]string{"-bootstrap", "-rpc-timeout", "-1s"}, "-rpc-timeout"},
		{[]string{"-bootstrap", "-dead-grace", "0s"}, "-dead-grace"},
		{[]string{"-bootstrap", "-max-chunks-per-request", "0"}, "-max-chunks-per-request 0"},
		{[]string{"-bootstrap", "-max-streams-per-client", "0"}, "-max-streams-per-client 0"},
		{[]string{"-bootstrap", "-max-unary-per-client", "0"}, "-max-unary-per-client 0"},
		{[]string{"-bootstrap", "-rebalance-recv-streams", "0"}, "-rebalance-recv-streams 0"},
		{[]string{"-bootstrap", "-rebalance-recv-streams", "1025"}, "-rebalance-recv-streams 1025"},
		{[]string{"-bootstrap-expect", "1000000"}, "-bootstrap-expect 1000000"},
		{[]string{"-bootstrap-expect", "-1"}, "-bootstrap-expect -1"},
		{[]string{"-bootstrap-expect", "6", "-join", "h:7401"}, "-bootstrap-expect 6"},
		{[]string{"-bootstrap", "-id", "a/b c"}, "-id"},
		{[]string{"-bootstrap", "-id", "tab\there"}, "-id"},
		{[]string{"-bootstrap", "-rebalance-rate", "0"}, "-rebalance-rate"},
		{[]string{"-bootstrap", "-bogus"}, "-bogus"},
		{[]string{"-bootstrap", "stray"}, `unexpected argument "stray"`},
	} {
		args := append(append([]string{}, base...), tc.args...)
		fc, err := parseArgs(args, io.Discard)
		if err == nil {
			_, err = fc.Config(io.Discard)
		}
		if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want a usage error naming %q", tc.args, err, tc.want)
		}
	}
	// What a flag documents is accepted.
	for _, ok := range [][]string{
		{"-bootstrap"}, {"-bootstrap", "-bootstrap-expect", "1"}, {"-bootstrap-expect", "1"},
		{"-bootstrap-expect", "3"}, {"-bootstrap-expect", "5", "-join", "h:7401"}, {"-bootstrap-expect", "0", "-join", "h:7401"}, {"-join", "h:7401,g:7401"},
		{"-bootstrap", "-max-streams-per-client", "-1"}, {"-bootstrap", "-rebalance-recv-streams", "1024"}, {"-bootstrap", "-disk", "0"},
		{"-bootstrap", "-id", "node-1.example"}, {"-bootstrap", "-raft-remove-after", "1s"},
		{"-bootstrap", "-http", "off"}, {"-bootstrap", "-grpc", "127.0.0.1:0"}, {"-bootstrap", "-gossip", "[::1]:7401"},
	} {
		fc, err := parseArgs(append(append([]string{}, base...), ok...), io.Discard)
		if err == nil {
			_, err = fc.Config(io.Discard)
		}
		if err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
}
