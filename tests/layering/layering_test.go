package layering

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

const (
	module  = "github.com/kvmesh/kvmesh"
	archDoc = "docs/ARCHITECTURE.md"
)

// goList runs the go command in the module root with a fixed target
// (linux/amd64, no cgo), so that the answer does not depend on the machine.
func goList(t *testing.T, root string, args ...string) []byte {
	t.Helper()
	return goListBuild(t, root, defaultBuild, args...)
}

// build is a configuration the module is built in: the default one, and
// the cuda one (cgo, the cuda tag) that links the GPU code.
type build struct {
	name string
	env  []string
	tags []string
}

var (
	defaultBuild = build{name: "default", env: []string{"CGO_ENABLED=0"}}
	cudaBuild    = build{name: "cuda", env: []string{"CGO_ENABLED=1"}, tags: []string{"-tags", "cuda"}}
)

// goListBuild is goList in build b. Listing needs neither a C compiler nor
// CUDA: nothing is compiled.
func goListBuild(t *testing.T, root string, b build, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", append(append([]string{"list"}, b.tags...), args...)...)
	cmd.Dir = root
	cmd.Env = append(append(os.Environ(), "GOOS=linux", "GOARCH=amd64"), b.env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root: %v", err)
	}
	return root
}

// tableRows reads the package table of the architecture doc: one entry
// per row, each the packages named (in backquotes) in its first cell,
// top row first. A row whose first cell says "(not Go)" is skipped.
func tableRows(doc []byte) ([][]string, error) {
	var rows [][]string
	in := false
	name := regexp.MustCompile("`([^`]+)`")
	sc := bufio.NewScanner(bytes.NewReader(doc))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			if in {
				break
			}
			in = line == "## Packages"
			continue
		}
		if !in || !strings.HasPrefix(line, "| `") {
			continue
		}
		first := strings.SplitN(line[1:], " | ", 2)[0]
		if strings.Contains(first, "(not Go)") {
			continue // a directory of another language, not a package
		}
		var row []string
		for _, m := range name.FindAllStringSubmatch(first, -1) {
			row = append(row, m[1])
		}
		rows = append(rows, row)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, errors.New("no package table under \"## Packages\"")
	}
	return rows, nil
}

type pkg struct {
	ImportPath string
	Imports    []string
}

// TestLayering: every package of the module has a row in the package
// table of docs/ARCHITECTURE.md, every row names packages that exist, and
// each package imports only packages on rows below its own (tests' own
// imports are not checked: an external test may import what it likes),
// in the default build and in the cuda one.
func TestLayering(t *testing.T) {
	root := moduleRoot(t)
	doc, err := os.ReadFile(filepath.Join(root, archDoc))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := tableRows(doc)
	if err != nil {
		t.Fatalf("%s: %v", archDoc, err)
	}
	for _, b := range []build{defaultBuild, cudaBuild} {
		var pkgs []pkg
		dec := json.NewDecoder(bytes.NewReader(goListBuild(t, root, b, "-e", "-json=ImportPath,Imports", "./...")))
		for {
			var p pkg
			if err := dec.Decode(&p); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatal(err)
			}
			pkgs = append(pkgs, p)
		}
		for _, msg := range check(rows, pkgs) {
			t.Errorf("%s build: %s", b.name, msg)
		}
	}
}

// TestNoCUDAInDefaultBinaries: a default build of any command links
// neither gorgonia.org/cu (whose init exits a process without a driver)
// nor the GPU code; the cuda build of kvmeshd and of the demo links
// cudakern/gpu, so the GPU is really wired in there.
func TestNoCUDAInDefaultBinaries(t *testing.T) {
	root := moduleRoot(t)
	deps := func(b build, cmd string) map[string]bool {
		set := map[string]bool{}
		for _, p := range strings.Fields(string(goListBuild(t, root, b, "-deps", cmd))) {
			set[p] = true
		}
		return set
	}
	cmds := strings.Fields(string(goList(t, root, "./cmd/...")))
	if len(cmds) == 0 {
		t.Fatal("no commands under ./cmd")
	}
	for _, c := range cmds {
		d := deps(defaultBuild, c)
		for _, bad := range []string{"gorgonia.org/cu", module + "/cudakern/gpu"} {
			if d[bad] {
				t.Errorf("the default build of %s links %s", c, bad)
			}
		}
	}
	for _, c := range []string{"./cmd/kvmeshd", "./cmd/kvmesh-demo"} {
		if !deps(cudaBuild, c)[module+"/cudakern/gpu"] {
			t.Errorf("the cuda build of %s does not link cudakern/gpu", c)
		}
	}
}

// check returns what breaks the layering rows states in pkgs (packages of
// the module with their non-test imports), one message per fault.
func check(rows [][]string, pkgs []pkg) []string {
	var faults []string
	fault := func(format string, args ...any) { faults = append(faults, fmt.Sprintf(format, args...)) }
	rowOf := make(map[string]int)
	for i, row := range rows {
		for _, p := range row {
			if prev, ok := rowOf[p]; ok {
				fault("%s: %s is on rows %d and %d of the package table", archDoc, p, prev+1, i+1)
			}
			rowOf[p] = i
		}
	}
	short := func(path string) (string, bool) {
		if path == module {
			return ".", true
		}
		return strings.CutPrefix(path, module+"/")
	}

	listed := make(map[string]bool)
	for _, p := range pkgs {
		name, _ := short(p.ImportPath)
		listed[name] = true
		if _, ok := rowOf[name]; !ok {
			fault("package %s has no row in the package table of %s: add one (its one idea) below every package that imports it and above every package it imports", name, archDoc)
		}
	}
	for _, row := range rows {
		for _, name := range row {
			if !listed[name] {
				fault("%s's package table names %s, which is not a package of the module: remove or rename it", archDoc, name)
			}
		}
	}

	for _, p := range pkgs {
		from, _ := short(p.ImportPath)
		fr, ok := rowOf[from]
		if !ok {
			continue
		}
		for _, imp := range p.Imports {
			to, ours := short(imp)
			if !ours {
				continue
			}
			tr, ok := rowOf[to]
			if !ok || tr > fr {
				continue
			}
			where := "above it"
			if tr == fr {
				where = "on the same row"
			}
			fault("layering: %s imports %s, which is %s in the package table of %s (rows %d and %d); imports point down the table. "+
				"Move the code so that the import is not needed, or, if the edge is intended, reorder the table so that %s sits on a row above %s",
				from, to, where, archDoc, fr+1, tr+1, from, to)
		}
	}
	return faults
}

func TestTableRows(t *testing.T) {
	doc := []byte("# x\n## Packages\nprose `notapkg`\n\n| package | one idea |\n|---|---|\n" +
		"| `a` | uses `b` in prose |\n| `b`, `c/d` | two \\| packages |\n| `py/` (not Go) | x |\n\n## Next\n| `e` | not in the table |\n")
	rows, err := tableRows(doc)
	if err != nil {
		t.Fatal(err)
	}
	if want := [][]string{{"a"}, {"b", "c/d"}}; !reflect.DeepEqual(rows, want) {
		t.Fatalf("rows %q, want %q", rows, want)
	}
	if _, err := tableRows([]byte("## Other\n| `a` | x |\n")); err == nil {
		t.Fatal("a doc without a package table parsed")
	}
}

func TestCheck(t *testing.T) {
	rows := [][]string{{"top"}, {"mid", "peer"}, {"low"}}
	p := func(name string, imports ...string) pkg {
		q := pkg{ImportPath: module + "/" + name}
		for _, i := range imports {
			q.Imports = append(q.Imports, module+"/"+i)
		}
		return q
	}
	tests := []struct {
		name string
		pkgs []pkg
		want []string // a substring of each fault, in order
	}{
		{"down", []pkg{p("top", "mid", "low", "fmt"), p("mid", "low"), p("peer"), p("low")}, nil},
		{"up", []pkg{p("top"), p("mid"), p("peer"), p("low", "top")}, []string{"low imports top, which is above it"}},
		{"same row", []pkg{p("top"), p("mid", "peer"), p("peer"), p("low")}, []string{"mid imports peer, which is on the same row"}},
		{"no row", []pkg{p("top"), p("mid"), p("peer"), p("low"), p("new", "top")}, []string{"package new has no row"}},
		{"stale row", []pkg{p("top"), p("mid"), p("low")}, []string{"names peer, which is not a package"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := check(rows, tc.pkgs)
			if len(got) != len(tc.want) {
				t.Fatalf("faults %q, want %d", got, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("fault %q does not say %q", got[i], w)
				}
			}
		})
	}
}
