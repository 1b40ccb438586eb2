package harness

import (
	"slices"
	"strings"
	"testing"
)

const sample = `-P OUTPUT ACCEPT
-A OUTPUT -d 127.0.0.13/32 -p udp -m cgroup --path "/kvmesh-chaos-1363-1/n4" -m multiport --dports 43443,43677 -m comment --comment kvmesh-chaos-1363-1 -j DROP
-A OUTPUT -d 127.0.0.1/32 -j ACCEPT
-A OUTPUT -s 10.0.0.1/32 -m comment --comment "someone else" -j DROP
-A INPUT -s 127.0.0.11/32 -d 127.0.0.12/32 -m comment --comment kvmesh-chaos-77-x -j DROP
`

func TestParseRules(t *testing.T) {
	for _, tc := range []struct {
		name string
		keep func(string) bool
		want []string
	}{
		{"all ours", func(string) bool { return true }, []string{
			`OUTPUT -d 127.0.0.13/32 -p udp -m cgroup --path /kvmesh-chaos-1363-1/n4 -m multiport --dports 43443,43677 -m comment --comment kvmesh-chaos-1363-1 -j DROP`,
			`INPUT -s 127.0.0.11/32 -d 127.0.0.12/32 -m comment --comment kvmesh-chaos-77-x -j DROP`,
		}},
		{"one run", func(tag string) bool { return tag == "kvmesh-chaos-77-x" }, []string{
			`INPUT -s 127.0.0.11/32 -d 127.0.0.12/32 -m comment --comment kvmesh-chaos-77-x -j DROP`,
		}},
		{"none", func(string) bool { return false }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, r := range parseRules(sample, tc.keep) {
				got = append(got, strings.Join(r, " "))
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}

func TestStale(t *testing.T) {
	for _, tc := range []struct {
		tag  string
		want bool
	}{
		{"kvmesh-chaos-notapid-x", true},
		{"kvmesh-chaos-1-x", false},         // init never exits
		{"kvmesh-chaos-2147483646-x", true}, // no such process
	} {
		if got := stale(tc.tag); got != tc.want {
			t.Errorf("stale(%q) = %v, want %v", tc.tag, got, tc.want)
		}
	}
}

// FuzzParseRules: any iptables -S text parses without panicking, and every
// rule it returns carries a tag of ours after --comment.
func FuzzParseRules(f *testing.F) {
	f.Add(sample)
	f.Add("-A\n-A INPUT --comment\n-A X --comment kvmesh-chaos-")
	f.Fuzz(func(t *testing.T, out string) {
		for _, r := range parseRules(out, func(string) bool { return true }) {
			i := slices.Index(r, "--comment")
			if i < 0 || i+1 >= len(r) || !strings.HasPrefix(r[i+1], TagPrefix) {
				t.Fatalf("rule without our tag: %q", r)
			}
		}
	})
}
