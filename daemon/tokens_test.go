package daemon

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/auth"
)

func recordLine(t testing.TB) string {
	_, rec, err := auth.NewToken("ops", auth.ScopeRead|auth.ScopeWrite, auth.Namespace{"ab"}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestReadTokenRecords(t *testing.T) {
	good := recordLine(t)
	for _, tc := range []struct {
		name string
		in   string
		want int
		bad  bool
	}{
		{name: "empty", in: "", want: 0},
		{name: "comments and blanks", in: "# x\n\n" + good + "\n  \n" + recordLine(t) + "\n", want: 2},
		{name: "not JSON", in: good + "\n{", bad: true},
		{name: "invalid record", in: `{"id":"zz"}`, bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recs, err := ReadTokenRecords(strings.NewReader(tc.in))
			if (err != nil) != tc.bad {
				t.Fatalf("err %v, bad %v", err, tc.bad)
			}
			if !tc.bad && len(recs) != tc.want {
				t.Fatalf("%d records, want %d", len(recs), tc.want)
			}
		})
	}
}

func FuzzReadTokenRecords(f *testing.F) {
	f.Add(recordLine(f))
	f.Add("# comment\n\n")
	f.Add(`{"id":"0123456789abcdef","salt":"","hash":"","scopes":"read"}`)
	f.Fuzz(func(t *testing.T, in string) {
		recs, err := ReadTokenRecords(strings.NewReader(in))
		if err != nil {
			return
		}
		for _, r := range recs {
			if err := r.Validate(); err != nil {
				t.Fatalf("returned an invalid record: %v", err)
			}
		}
	})
}
