// Package buildinfo says which build of kvmesh is running: the module
// version, the VCS commit and the Go version, read from the binary
// (runtime/debug.ReadBuildInfo). Imports nothing of ours.
//
// A build with -buildvcs=false (the Makefile's: Go's VCS stamping fails
// in some work trees and CI checkouts) carries no commit; `make build`
// passes it with the linker instead:
//
//	-ldflags "-X github.com/kvmesh/kvmesh/internal/buildinfo.commit=HASH -X github.com/kvmesh/kvmesh/internal/buildinfo.modified=true"
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Info is a binary's build. Its JSON field names are stable.
type Info struct {
	// Version is the main module's version: a tag, a pseudo-version, or
	// "(devel)" for a build from a work tree.
	Version string `json:"version"`
	// Commit is the VCS revision ("" when the build did not stamp it);
	// Modified says the work tree had changes.
	Commit   string `json:"commit"`
	Modified bool   `json:"modified"`
	// GoVersion is the toolchain that built the binary.
	GoVersion string `json:"go_version"`
}

// commit and modified are set by the linker (-X; see the package doc);
// they are variables only because -X can set nothing else, and nothing
// writes them at run time. Go's own VCS stamp wins over them.
var (
	commit   string
	modified string // "true" when the work tree had changes
)

// Read returns the running binary's build.
func Read() Info {
	info := Info{Version: "(unknown)", GoVersion: runtime.Version(), Commit: commit, Modified: modified == "true"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return info
	}
	if bi.Main.Version != "" {
		info.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Commit = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

// String is the one line `kvmesh version` and `kvmeshd version` print
// after the program's name.
func (i Info) String() string {
	commit := i.Commit
	if commit == "" {
		commit = "unknown"
	}
	if i.Modified {
		commit += "+modified"
	}
	return fmt.Sprintf("%s (commit %s, %s)", i.Version, commit, i.GoVersion)
}
