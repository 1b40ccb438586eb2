// Package packaging checks the deployment files under deploy/ against the
// code they package, since neither a container nor systemd runs in the
// tests: the Containerfile builds what `make build` builds with go.mod's Go
// and exposes kvmeshd's default ports; the systemd unit's ExecStart parses
// as kvmeshd flags, its RestartPreventExitStatus names the exit codes a
// restart cannot fix, and `systemd-analyze verify` accepts it where
// systemd is installed; the example configuration is a kvmeshd -config file.
package packaging

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/daemon"
)

const root = "../.."

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// makeRecipe returns the recipe lines of a Makefile target.
func makeRecipe(t *testing.T, makefile, target string) []string {
	t.Helper()
	var out []string
	in := false
	for _, l := range strings.Split(makefile, "\n") {
		switch {
		case strings.HasPrefix(l, target+":"):
			in = true
		case in && strings.HasPrefix(l, "\t"):
			out = append(out, strings.TrimSpace(l))
		case in:
			return out
		}
	}
	if len(out) == 0 {
		t.Fatalf("Makefile has no recipe for %q", target)
	}
	return out
}

// instruction is one Containerfile instruction with its stage.
type instruction struct {
	stage     int
	op, args  string
	stageName string
}

func parseContainerfile(text string) []instruction {
	var out []instruction
	stage, name := -1, ""
	var cur strings.Builder
	for _, l := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(l)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if s, cont := strings.CutSuffix(trimmed, `\`); cont {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(trimmed)
		line := cur.String()
		cur.Reset()
		op, args, _ := strings.Cut(line, " ")
		op = strings.ToUpper(op)
		if op == "FROM" {
			stage++
			name = ""
			if f := strings.Fields(args); len(f) == 3 && strings.EqualFold(f[1], "AS") {
				name = f[2]
			}
		}
		out = append(out, instruction{stage, op, strings.TrimSpace(args), name})
	}
	return out
}

// TestContainerfile: the image's binaries are `make build`'s, built with
// go.mod's Go release, static; it runs as a non-root user, exposes the
// default ports and keeps its data directory in a volume.
func TestContainerfile(t *testing.T) {
	ins := parseContainerfile(read(t, "deploy/Containerfile"))
	recipe := makeRecipe(t, read(t, "Makefile"), "build")
	if len(recipe) != 1 || !strings.Contains(recipe[0], "CGO_ENABLED=0") || !strings.Contains(recipe[0], "-trimpath") {
		t.Fatalf("make build is %q: the image expects one static (CGO_ENABLED=0, -trimpath) go build", recipe)
	}
	bin := "bin"
	if m := regexp.MustCompile(`(?m)^BIN\s*:?=\s*(\S+)`).FindStringSubmatch(read(t, "Makefile")); m != nil {
		bin = m[1]
	}
	// The builder runs `make build` or the same command spelled out.
	same := strings.NewReplacer("$(GO)", "go", "$(BIN)", bin).Replace(recipe[0])
	var builder, workdir string
	built := false
	for _, in := range ins {
		if in.stage != 0 {
			continue
		}
		switch in.op {
		case "FROM":
			builder = strings.Fields(in.args)[0]
		case "WORKDIR":
			workdir = in.args
		case "RUN":
			for _, cmd := range strings.Split(in.args, "&&") {
				if c := strings.TrimSpace(cmd); c == "make build" || c == same {
					built = true
				}
			}
		}
	}
	if !built {
		t.Errorf("the builder stage does not run `make build` (nor %q)", same)
	}
	goMod := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(read(t, "go.mod"))
	if goMod == nil || !strings.Contains(builder, "golang:"+goMod[1]) {
		t.Errorf("builder image %q is not golang:%s of go.mod", builder, goMod)
	}
	var exposed, users, volumes []string
	var copied []string
	var entry, cmd []string
	for _, in := range ins {
		if in.stage != ins[len(ins)-1].stage {
			continue
		}
		switch in.op {
		case "EXPOSE":
			exposed = append(exposed, strings.Fields(in.args)...)
		case "USER":
			users = append(users, in.args)
		case "VOLUME":
			var v []string
			if json.Unmarshal([]byte(in.args), &v) != nil {
				v = strings.Fields(in.args)
			}
			volumes = append(volumes, v...)
		case "COPY":
			f := strings.Fields(in.args)
			if slices.Contains(f, "--from=build") {
				for _, src := range f[:len(f)-1] {
					if !strings.HasPrefix(src, "--") {
						copied = append(copied, src)
					}
				}
			}
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(in.args), &entry); err != nil {
				t.Fatalf("ENTRYPOINT %s: %v", in.args, err)
			}
		case "CMD":
			if err := json.Unmarshal([]byte(in.args), &cmd); err != nil {
				t.Fatalf("CMD %s: %v", in.args, err)
			}
		}
	}
	for _, want := range []string{"kvmeshd", "kvmesh"} {
		src := workdir + "/" + bin + "/" + want
		if !slices.Contains(copied, src) {
			t.Errorf("the image does not copy %s (make build's output); copies %v", src, copied)
		}
		if _, err := os.Stat(filepath.Join(root, "cmd", want)); err != nil {
			t.Errorf("cmd/%s: %v", want, err)
		}
	}
	if len(users) == 0 || slices.ContainsFunc(users, func(u string) bool { return u == "root" || u == "0" || strings.HasPrefix(u, "0:") }) {
		t.Errorf("USER %v: the image must run as a non-root user", users)
	}
	wantPorts := []string{strconv.Itoa(daemon.DefaultGRPCPort) + "/tcp", strconv.Itoa(daemon.DefaultGossipPort) + "/tcp",
		strconv.Itoa(daemon.DefaultGossipPort) + "/udp", strconv.Itoa(daemon.DefaultRaftPort) + "/tcp", strconv.Itoa(daemon.DefaultHTTPPort) + "/tcp"}
	slices.Sort(exposed)
	slices.Sort(wantPorts)
	if !slices.Equal(exposed, wantPorts) {
		t.Errorf("EXPOSE %v, want kvmeshd's default ports %v", exposed, wantPorts)
	}
	if len(entry) != 1 || filepath.Base(entry[0]) != "kvmeshd" {
		t.Fatalf("ENTRYPOINT %v, want kvmeshd", entry)
	}
	dataDir := flagValue(cmd, "-data-dir")
	if dataDir == "" || !slices.Contains(volumes, dataDir) {
		t.Errorf("CMD's -data-dir %q is not a VOLUME (%v)", dataDir, volumes)
	}
	checkFlags(t, "CMD", cmd)
}

// flagValue is the value of flag name in args ("-name v" or "-name=v").
func flagValue(args []string, name string) string {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// checkFlags parses args as kvmeshd's command line up to a -h after them:
// an unknown flag or a value of the wrong kind fails.
func checkFlags(t *testing.T, what string, args []string) {
	t.Helper()
	var stderr bytes.Buffer
	err := daemon.Run(context.Background(), append(slices.Clone(args), "-h"), &stderr, &stderr)
	if !errors.Is(err, flag.ErrHelp) {
		t.Errorf("%s %q is not a kvmeshd command line: %v\n%s", what, args, err, stderr.String())
	}
}

// unit is a systemd unit file: section -> key -> values in order.
type unit map[string]map[string][]string

func parseUnit(text string) unit {
	u := unit{}
	sec := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, ";"):
		case strings.HasPrefix(l, "["):
			sec = strings.Trim(l, "[]")
			u[sec] = map[string][]string{}
		default:
			k, v, _ := strings.Cut(l, "=")
			u[sec][strings.TrimSpace(k)] = append(u[sec][strings.TrimSpace(k)], strings.TrimSpace(v))
		}
	}
	return u
}

// TestSystemdUnit: ExecStart is a kvmeshd command line; a restart is not
// tried on the exit codes it cannot fix; the hardening is there; and
// systemd-analyze verify accepts the unit where systemd is installed.
func TestSystemdUnit(t *testing.T) {
	text := read(t, "deploy/kvmeshd.service")
	svc := parseUnit(text)["Service"]
	if svc == nil {
		t.Fatal("no [Service] section")
	}
	one := func(k string) string {
		if v := svc[k]; len(v) > 0 {
			return v[len(v)-1]
		}
		return "<unset>"
	}
	execStart := strings.Fields(one("ExecStart"))
	if len(execStart) == 0 || filepath.Base(execStart[0]) != "kvmeshd" {
		t.Fatalf("ExecStart %q does not run kvmeshd", execStart)
	}
	checkFlags(t, "ExecStart", execStart[1:])
	dataDir := flagValue(execStart[1:], "-data-dir")
	if dataDir == "" || !slices.Contains(strings.Fields(one("ReadWritePaths")), dataDir) {
		t.Errorf("ReadWritePaths %q lacks ExecStart's -data-dir %q", one("ReadWritePaths"), dataDir)
	}
	prevent := strings.Fields(one("RestartPreventExitStatus"))
	for _, code := range []int{daemon.ExitUsage, daemon.ExitLeft} {
		if !slices.Contains(prevent, strconv.Itoa(code)) {
			t.Errorf("RestartPreventExitStatus %v lacks %d", prevent, code)
		}
	}
	if slices.Contains(prevent, strconv.Itoa(daemon.ExitError)) || one("Restart") != "on-failure" {
		t.Errorf("Restart=%s RestartPreventExitStatus=%v: an error exit (%d) must be restarted, a clean one (0: stopped or drained) not",
			one("Restart"), prevent, daemon.ExitError)
	}
	for k, want := range map[string]string{"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes",
		"CapabilityBoundingSet": "", "AmbientCapabilities": "", "ProtectHome": "yes", "RestrictSUIDSGID": "yes"} {
		if got := one(k); got != want {
			t.Errorf("%s=%s, want %q", k, got, want)
		}
	}
	if n, err := strconv.Atoi(one("LimitNOFILE")); err != nil || n < 65536 {
		t.Errorf("LimitNOFILE=%s, want at least 65536", one("LimitNOFILE"))
	}
	if one("User") == "root" || (one("User") == "<unset>" && one("DynamicUser") != "yes") {
		t.Errorf("User=%s DynamicUser=%s: kvmeshd must not run as root", one("User"), one("DynamicUser"))
	}

	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (apt-get install systemd): the unit was not verified by systemd")
	}
	// verify wants ExecStart's binary to exist: point it at this test's
	// own executable, changing nothing else.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kvmeshd.service")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(text, execStart[0], self)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sa, "verify", path).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestExampleConfig: deploy/kvmeshd.json is a kvmeshd -config file (read
// as kvmeshd reads it: unknown fields refused).
func TestExampleConfig(t *testing.T) {
	dec := json.NewDecoder(strings.NewReader(read(t, "deploy/kvmeshd.json")))
	dec.DisallowUnknownFields()
	var fc daemon.FileConfig
	if err := dec.Decode(&fc); err != nil {
		t.Fatal(err)
	}
	if fc.ID == "" || fc.GRPC == "" || fc.TLS.CertFile == "" || !fc.Auth.Tokens {
		t.Errorf("the example lacks an id, a gRPC address, TLS or tokens: %+v", fc)
	}
}
