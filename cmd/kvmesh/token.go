package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/auth"
)

const tokenUsage = `usage:
  kvmesh [-addr A] [-token ADMIN] token create [-name N] [-scopes read,write,admin] [-namespace HEX,...] [-expires D]
  kvmesh [-addr A] [-token ADMIN] token list
  kvmesh [-addr A] [-token ADMIN] token revoke ID
  kvmesh token create -records FILE [-name N] [-scopes S] [-namespace HEX,...] [-expires D]   (offline bootstrap)`

// tokenCmd is `kvmesh token create|list|revoke`. With -records, create
// works offline: it makes a token, prints it once and appends its record
// (never the secret) to a file that kvmeshd -tokens-file stores in the
// cluster (the way to make the first admin token). Without it every
// subcommand calls the Admin API of the node at -addr with the admin
// token of -token.
func tokenCmd(ctx context.Context, args []string, dial adminDialer, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New(tokenUsage)
	}
	switch args[0] {
	case "create":
		return tokenCreate(ctx, args[1:], dial, stdout, stderr)
	case "list":
		if len(args) != 1 {
			return errors.New(tokenUsage)
		}
		ac, done, err := dial()
		if err != nil {
			return err
		}
		defer done()
		resp, err := ac.ListTokens(ctx, &api.ListTokensRequest{})
		if err != nil {
			return fmt.Errorf("token list: %w", err)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tSCOPES\tNAMESPACE\tCREATED\tEXPIRES")
		for _, t := range resp.Tokens {
			exp := "never"
			if t.Expires != 0 {
				exp = time.Unix(t.Expires, 0).UTC().Format(time.RFC3339)
			}
			ns := strings.Join(t.Namespace, ",")
			if ns == "" {
				ns = "*"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.Id, t.Name, t.Scopes, ns, time.Unix(t.Created, 0).UTC().Format(time.RFC3339), exp)
		}
		return tw.Flush()
	case "revoke":
		if len(args) != 2 {
			return errors.New(tokenUsage)
		}
		// Accept a whole token too: only its ID is sent.
		id, _, _ := strings.Cut(args[1], ".")
		ac, done, err := dial()
		if err != nil {
			return err
		}
		defer done()
		if _, err := ac.RevokeToken(ctx, &api.RevokeTokenRequest{Id: id}); err != nil {
			return fmt.Errorf("token revoke: %w", err)
		}
		fmt.Fprintln(stdout, "revoked", id)
		return nil
	}
	return errors.New(tokenUsage)
}

func tokenCreate(ctx context.Context, args []string, dial adminDialer, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("token create", flag.ContinueOnError)
	fs.SetOutput(stderr)
	records := fs.String("records", "", "offline: append the record to this file (mode 0600; kvmeshd -tokens-file) instead of calling the cluster")
	name := fs.String("name", "", "label of the token")
	scopes := fs.String("scopes", "read", "comma-separated scopes: read, write, admin")
	namespace := fs.String("namespace", "", "comma-separated model fingerprint prefixes (hex) the token is limited to")
	expires := fs.Duration("expires", 0, "lifetime (0: never expires)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("token create: unexpected argument %q", fs.Arg(0))
	}
	sc, err := auth.ParseScopes(*scopes)
	if err != nil {
		return fmt.Errorf("token create: %w", err)
	}
	ns, err := auth.ParseNamespace(*namespace)
	if err != nil {
		return fmt.Errorf("token create: %w", err)
	}
	if *expires < 0 {
		return errors.New("token create: negative -expires")
	}
	if *records == "" {
		ac, done, err := dial()
		if err != nil {
			return err
		}
		defer done()
		resp, err := ac.CreateToken(ctx, &api.CreateTokenRequest{Name: *name, Scopes: sc.String(), Namespace: ns,
			TtlSeconds: int64(expires.Seconds())})
		if err != nil {
			return fmt.Errorf("token create: %w", err)
		}
		fmt.Fprintln(stdout, resp.Token)
		return nil
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
