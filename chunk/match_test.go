package chunk

import "testing"

func TestMatchString(t *testing.T) {
	for m, want := range map[Match]string{MatchMiss: "miss", MatchApproximate: "approximate", MatchExact: "exact"} {
		if got := m.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", m, got, want)
		}
	}
	if !(MatchMiss < MatchApproximate && MatchApproximate < MatchExact) {
		t.Error("Match values are not ordered by quality")
	}
}

func TestMatchOf(t *testing.T) {
	want := PrefixContext(ID{Lo: 1})
	if got := MatchOf(want, want); got != MatchExact {
		t.Errorf("same context: %v", got)
	}
	if got := MatchOf(want, StandaloneContext()); got != MatchApproximate {
		t.Errorf("other context: %v", got)
	}
}

// TestBetter is the ranking of stored encodings, pair by pair: each row's a
// must rank above b, and b never above a.
func TestBetter(t *testing.T) {
	prefix := func(lo uint64) Context { return PrefixContext(ID{Lo: lo}) }
	window := func(w uint32, lo uint64) Context { return Context{Kind: ContextWindow, Window: w, ID: ID{Lo: lo}} }
	standalone := StandaloneContext()
	unknown := Context{Kind: 9, ID: ID{Lo: 1}}
	want := prefix(5)
	for _, tc := range []struct {
		name string
		want Context
		a, b Context
	}{
		{"wanted prefix over another prefix", want, want, prefix(1)},
		{"wanted prefix over a window", want, want, window(64, 1)},
		{"wanted prefix over standalone", want, want, standalone},
		{"wanted window over a prefix", window(8, 3), window(8, 3), prefix(1)},
		{"wanted window over a wider window", window(8, 3), window(8, 3), window(64, 1)},
		{"wanted standalone over a prefix", standalone, standalone, prefix(1)},
		{"another prefix over a window", want, prefix(9), window(64, 1)},
		{"another prefix over standalone", want, prefix(9), standalone},
		{"wider window over narrower", want, window(64, 9), window(8, 1)},
		{"window over standalone", want, window(1, 9), standalone},
		{"standalone over an unknown kind", want, standalone, unknown},
		{"prefix tie: lower ID", want, prefix(1), prefix(2)},
		{"prefix tie: lower ID by Hi", want, PrefixContext(ID{Hi: 1}), PrefixContext(ID{Hi: 2, Lo: 0})},
		{"window tie: lower ID", want, window(8, 1), window(8, 2)},
		{"unknown kinds: lower ID", want, Context{Kind: 9, ID: ID{Lo: 1}}, Context{Kind: 9, ID: ID{Lo: 2}}},
		{"unknown kinds: lower kind", want, Context{Kind: 0}, Context{Kind: 9}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !Better(tc.want, tc.a, tc.b) {
				t.Errorf("Better(%v, %v, %v) = false, want true", tc.want, tc.a, tc.b)
			}
			if Better(tc.want, tc.b, tc.a) {
				t.Errorf("Better(%v, %v, %v) = true, want false", tc.want, tc.b, tc.a)
			}
			if Better(tc.want, tc.a, tc.a) {
				t.Errorf("Better(%v, %v, %v) = true: a context is not better than itself", tc.want, tc.a, tc.a)
			}
		})
	}
}
