package node

import (
	"testing"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
)

// TestBetterAnswer: the merge of replicas' lookup answers keeps the best
// encoding by chunk.Better, whichever replica answered it, and the first in
// ring order among equal answers.
func TestBetterAnswer(t *testing.T) {
	fp := chunk.Fingerprint{Lo: 1, Hi: 2}
	content := chunk.ID{Lo: 3}
	want := chunk.PrefixContext(chunk.ID{Lo: 4})
	answer := func(m chunk.Match, cx chunk.Context) *api.LookupResult {
		a := &api.LookupResult{Status: api.ProtoMatch(m)}
		if m != chunk.MatchMiss {
			a.Key = api.ProtoKey(chunk.Key{Fingerprint: fp, Content: content, Context: cx})
		}
		return a
	}
	exact := answer(chunk.MatchExact, want)
	prefix := answer(chunk.MatchApproximate, chunk.PrefixContext(chunk.ID{Lo: 9}))
	window := answer(chunk.MatchApproximate, chunk.WindowContext(fp, 8, []uint32{1}))
	standalone := answer(chunk.MatchApproximate, chunk.StandaloneContext())
	miss := answer(chunk.MatchMiss, chunk.Context{})
	malformed := &api.LookupResult{Status: api.LookupStatus_LOOKUP_STATUS_EXACT, Key: &api.Key{}}
	for _, tc := range []struct {
		name    string
		answers []*api.LookupResult // in ring order; nil: no answer
		best    *api.LookupResult   // nil: a miss
	}{
		{"exact after approximates", []*api.LookupResult{standalone, window, exact}, exact},
		{"prefix over an earlier window", []*api.LookupResult{window, prefix}, prefix},
		{"window over an earlier standalone", []*api.LookupResult{standalone, miss, window}, window},
		{"hit over misses and silence", []*api.LookupResult{miss, nil, standalone}, standalone},
		{"equal answers: the first", []*api.LookupResult{window, answer(chunk.MatchApproximate, chunk.WindowContext(fp, 8, []uint32{1}))}, window},
		{"a malformed key is no answer", []*api.LookupResult{malformed, standalone}, standalone},
		{"all misses", []*api.LookupResult{miss, nil, malformed}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var best *api.LookupResult
			for _, a := range tc.answers {
				if betterAnswer(want, a, best) {
					best = a
				}
			}
			if best != tc.best {
				t.Errorf("kept %v, want %v", best, tc.best)
			}
		})
	}
}
