package main

import (
	"context"
	"fmt"
	"io"

	"github.com/kvmesh/kvmesh/internal/buildinfo"
)

// versionOut is `kvmesh version -format json`.
type versionOut = buildinfo.Info

func versionCmd(_ context.Context, e *env, args []string) error {
	if _, err := e.parse(e.flags("version"), args, 0, 0); err != nil {
		return err
	}
	info := buildinfo.Read()
	return e.print(versionOut(info), func(w io.Writer) error {
		_, err := fmt.Fprintln(w, "kvmesh", info)
		return err
	})
}
