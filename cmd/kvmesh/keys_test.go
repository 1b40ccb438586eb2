package main

import (
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
)

func TestParseKeyRoundTrip(t *testing.T) {
	fp := chunk.Fingerprint{Lo: 0x0123456789abcdef, Hi: 0xfedcba9876543210}
	keys := []chunk.Key{
		{Fingerprint: fp, Content: chunk.ID{Lo: 1, Hi: 2}, Context: chunk.StandaloneContext()},
		{Fingerprint: fp, Content: chunk.ID{Lo: ^uint64(0), Hi: 0}, Context: chunk.WindowContext(fp, 32, []uint32{1, 2, 3})},
		{Fingerprint: fp, Content: chunk.ID{Lo: 5, Hi: 6}, Context: chunk.PrefixContext(chunk.ID{Lo: 7, Hi: 8})},
	}
	for _, k := range keys {
		got, err := parseKey(k.String())
		if err != nil {
			t.Fatalf("%v: %v", k, err)
		}
		if got != k {
			t.Fatalf("parse(%v) = %v", k, got)
		}
	}
	for _, bad := range []string{"", "a/b", fp.String() + "/x/standalone", fp.String() + "/" + fp.String() + "/window(x):00", fp.String() + "/" + fp.String() + "/other"} {
		if _, err := parseKey(bad); err == nil {
			t.Fatalf("parseKey(%q) accepted", bad)
		}
	}
}

func FuzzParseKey(f *testing.F) {
	f.Add("fedcba98765432100123456789abcdef/00000000000000020000000000000001/standalone")
	f.Add("fedcba98765432100123456789abcdef/00000000000000020000000000000001/window(4):00000000000000020000000000000001")
	f.Add("x/y/prefix:z")
	f.Fuzz(func(t *testing.T, s string) {
		k, err := parseKey(s)
		if err != nil {
			return
		}
		// What parses must print back to something that parses the same.
		k2, err := parseKey(k.String())
		if err != nil || k2 != k {
			t.Fatalf("%q -> %v -> %v, %v", s, k, k2, err)
		}
	})
}
