package framework

import (
	"fmt"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/replication"
)

// StaleWinningValues picks two values of a Redis-door key (the door's
// keyspace without a token namespace) that the one-version-per-key rule,
// replication.Wins over the unversioned entries' checksums, would settle
// on the first of: the pair with which a replica that missed the
// replacement of v1 by v2 brought v1 back under that rule.
func StaleWinningValues(t testing.TB, key string) (v1, v2 string) {
	t.Helper()
	fp := chunk.OpaqueSpec("resp:").Fingerprint()
	sum := func(v string) uint64 {
		blob, err := chunk.EncodeOpaque(nil, fp, []byte(key), []byte(v), chunk.ID{}, chunk.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		hd, err := chunk.ParseHeader(blob, chunk.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		return hd.Checksum
	}
	for i := range 64 {
		v1, v2 = fmt.Sprintf("old value %d", i), fmt.Sprintf("new value %d", i)
		if replication.Wins(sum(v1), sum(v2)) {
			return v1, v2
		}
	}
	t.Fatal("no pair of values whose old one wins by checksum")
	return "", ""
}
