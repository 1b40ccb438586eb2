package daemon

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/kvmesh/kvmesh/auth"
)

// ReadTokenRecords reads token records, one JSON auth.Record a line
// (blank lines and lines starting with # skipped), each validated.
func ReadTokenRecords(r io.Reader) ([]auth.Record, error) {
	var recs []auth.Record
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		t := strings.TrimSpace(sc.Text())
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		var rec auth.Record
		if err := json.Unmarshal([]byte(t), &rec); err != nil {
			return nil, fmt.Errorf("token record line %d: %w", line, err)
		}
		if err := rec.Validate(); err != nil {
			return nil, fmt.Errorf("token record line %d: %w", line, err)
		}
		recs = append(recs, rec)
	}
	return recs, sc.Err()
}

// tokenRecords reads the daemon's tokens file, if any.
func (fc *FileConfig) tokenRecords() ([]auth.Record, error) {
	if fc.Auth.TokensFile == "" {
		return nil, nil
	}
	f, err := os.Open(fc.Auth.TokensFile)
	if err != nil {
		return nil, fmt.Errorf("kvmeshd: tokens file: %w", err)
	}
	defer f.Close()
	recs, err := ReadTokenRecords(f)
	if err != nil {
		return nil, fmt.Errorf("kvmeshd: %s: %w", fc.Auth.TokensFile, err)
	}
	return recs, nil
}
