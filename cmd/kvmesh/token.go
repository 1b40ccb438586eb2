package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kvmesh/kvmesh/auth"
)

// tokenCmd is `kvmesh token create`: it makes a token, prints it once and
// appends its record (never the secret) to a records file that kvmeshd
// -tokens-file stores in the cluster's metadata.
func tokenCmd(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "create" {
		return errors.New("usage: kvmesh token create -records FILE [-name N] [-scopes read,write,admin] [-namespace HEX,...] [-expires D]")
	}
	fs := flag.NewFlagSet("token create", flag.ContinueOnError)
	fs.SetOutput(stderr)
	records := fs.String("records", "", "file the record is appended to (mode 0600; kvmeshd -tokens-file) (required)")
	name := fs.String("name", "", "label of the token")
	scopes := fs.String("scopes", "read", "comma-separated scopes: read, write, admin")
	namespace := fs.String("namespace", "", "comma-separated model fingerprint prefixes (hex) the token is limited to")
	expires := fs.Duration("expires", 0, "lifetime (0: never expires)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *records == "" {
		return errors.New("token create: -records is required")
	}
	sc, err := auth.ParseScopes(*scopes)
	if err != nil {
		return fmt.Errorf("token create: %w", err)
	}
	ns, err := auth.ParseNamespace(*namespace)
	if err != nil {
		return fmt.Errorf("token create: %w", err)
	}
	var exp time.Time
	if *expires > 0 {
		exp = time.Now().Add(*expires).UTC()
	}
	tok, rec, err := auth.NewToken(*name, sc, ns, exp)
	if err != nil {
		return err
	}
	line, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(*records, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("token create: %w", err)
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		_ = f.Close()
		return fmt.Errorf("token create: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("token create: %w", err)
	}
	fmt.Fprintln(stdout, tok.String())
	return nil
}
