package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
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

// tokenOut is one token of `kvmesh token list -format json` (no secret).
type tokenOut struct {
	ID        string   `json:"id"`
	Name      string   `json:"name"`
	Scopes    string   `json:"scopes"`
	Namespace []string `json:"namespace"`
	Created   string   `json:"created"`
	Expires   string   `json:"expires,omitempty"`
}

// tokenCmd is `kvmesh token create|list|revoke`. With -records, create
// works offline: it makes a token, prints it once and appends its record
// (never the secret) to a file that kvmeshd -tokens-file stores in the
// cluster (the way to make the first admin token). Without it every
// subcommand calls the Admin API with the admin token of -token.
func tokenCmd(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 {
		return usagef("token: missing subcommand (create, list or revoke)")
	}
	switch args[0] {
	case "create":
		return tokenCreate(ctx, e, args[1:])
	case "list":
		if _, err := e.parse(e.flags("token list"), args[1:], 0, 0); err != nil {
			return err
		}
		a, err := e.admin(ctx)
		if err != nil {
			return err
		}
		defer a.close()
		toks, err := listTokens(a)
		if err != nil {
			return err
		}
		return e.print(toks, func(w io.Writer) error {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tSCOPES\tNAMESPACE\tCREATED\tEXPIRES")
			for _, t := range toks {
				ns := strings.Join(t.Namespace, ",")
				if ns == "" {
					ns = "*"
				}
				exp := t.Expires
				if exp == "" {
					exp = "never"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Name, t.Scopes, ns, t.Created, exp)
			}
			return tw.Flush()
		})
	case "revoke":
		pos, err := e.parse(e.flags("token revoke"), args[1:], 1, 1)
		if err != nil {
			return err
		}
		// Accept a whole token too: only its ID is sent.
		id, _, _ := strings.Cut(pos[0], ".")
		a, err := e.admin(ctx)
		if err != nil {
			return err
		}
		defer a.close()
		if err := a.requireLeader(); err != nil {
			return err
		}
		// Revoking is idempotent in the cluster; an ID it does not know
		// is most likely a typo, which must not look like success.
		toks, err := listTokens(a)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(toks, func(t tokenOut) bool { return t.ID == id }) {
			return &plainError{msg: fmt.Sprintf("token revoke: no token with ID %q", id), hint: "kvmesh token list shows the IDs"}
		}
		if _, err := a.RevokeToken(a.ctx, &api.RevokeTokenRequest{Id: id}); err != nil {
			return plain("token revoke", err)
		}
		return e.print(map[string]string{"revoked": id}, func(w io.Writer) error {
			_, err := fmt.Fprintln(w, "revoked", id)
			return err
		})
	case "-h", "-help", "--help":
		printHelp(e.stdout, "token", nil)
		return flag.ErrHelp
	}
	return usagef("token: unknown subcommand %q (create, list or revoke)", args[0])
}

// listTokens is the cluster's tokens, without secrets.
func listTokens(a *adminConn) ([]tokenOut, error) {
	resp, err := a.ListTokens(a.ctx, &api.ListTokensRequest{})
	if err != nil {
		return nil, plain("token list", err)
	}
	out := []tokenOut{}
	for _, t := range resp.Tokens {
		to := tokenOut{ID: t.Id, Name: t.Name, Scopes: t.Scopes, Namespace: t.Namespace,
			Created: time.Unix(t.Created, 0).UTC().Format(time.RFC3339)}
		if to.Namespace == nil {
			to.Namespace = []string{}
		}
		if t.Expires != 0 {
			to.Expires = time.Unix(t.Expires, 0).UTC().Format(time.RFC3339)
		}
		out = append(out, to)
	}
	return out, nil
}

func tokenCreate(ctx context.Context, e *env, args []string) error {
	fs := e.flags("token create")
	records := fs.String("records", "", "offline: append the record to this file (mode 0600; kvmeshd -tokens-file) instead of calling the cluster")
	name := fs.String("name", "", "label of the token")
	scopes := fs.String("scopes", "read", "comma-separated scopes: read, write, admin")
	namespace := fs.String("namespace", "", "comma-separated model fingerprint prefixes (hex) the token is limited to")
	expires := fs.Duration("expires", 0, "lifetime (0: never expires)")
	if _, err := e.parse(fs, args, 0, 0); err != nil {
		return err
	}
	sc, err := auth.ParseScopes(*scopes)
	if err != nil {
		return usagef("token create: %v", err)
	}
	ns, err := auth.ParseNamespace(*namespace)
	if err != nil {
		return usagef("token create: %v", err)
	}
	if *expires < 0 {
		return usagef("token create: negative -expires")
	}
	printToken := func(tok string) error {
		return e.print(map[string]string{"token": tok}, func(w io.Writer) error {
			_, err := fmt.Fprintln(w, tok)
			return err
		})
	}
	if *records == "" {
		a, err := e.admin(ctx)
		if err != nil {
			return err
		}
		defer a.close()
		if err := a.requireLeader(); err != nil {
			return err
		}
		resp, err := a.CreateToken(a.ctx, &api.CreateTokenRequest{Name: *name, Scopes: sc.String(), Namespace: ns,
			TtlSeconds: int64(expires.Seconds())})
		if err != nil {
			return plain("token create", err)
		}
		return printToken(resp.Token)
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
	return printToken(tok.String())
}
