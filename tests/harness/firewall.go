package harness

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNoFirewall: partitions cannot be made here (no root, no iptables, or
// no backend that accepts rules). The wrapped text says why.
var ErrNoFirewall = errors.New("harness: no usable iptables")

// TagPrefix starts the comment of every rule a Firewall adds; the rest of
// the tag is the owning process ID and a run ID, so a sweep can tell rules
// of a dead run from those of a live one.
const TagPrefix = "kvmesh-chaos-"

// Endpoint is one node as the firewall sees it: its ID (which names its
// cgroup, see Cgroup), its host and the ports it listens on (TCP and UDP
// alike).
type Endpoint struct {
	ID    string
	Host  string
	Ports []int
}

// Firewall cuts links between loopback nodes with iptables rules, each
// tagged with the comment TagPrefix+PID-RUNID, so that Heal removes exactly
// the rules of this run, and Sweep those of runs whose process is gone.
//
// Why not `iptables -I INPUT -s A -d B -j DROP`: a node bound to A dials
// other nodes without binding its source address, so the kernel sends
// from 127.0.0.1 and a rule on source A matches only UDP gossip. Each node
// therefore runs in its own cgroup (v2); a mangle OUTPUT rule marks what
// the sending process (-m cgroup --path) sends to the receiving node's
// host and listening ports, and a filter INPUT rule drops marked packets.
// Matching ports also keeps other processes on the same loopback
// addresses (another suite) out of it.
type Firewall struct {
	bin     string
	tag     string
	cgMount string // where the cgroup2 hierarchy is mounted
	cgRoot  string // that mount's root inside the hierarchy
	run     string // this run's cgroup, relative to the mount

	mu            sync.Mutex
	dropInstalled bool // the INPUT rule that drops marked packets
}

// NewFirewall finds the cgroup2 hierarchy, makes this run's cgroup, and
// picks the iptables backend that accepts a tagged cgroup rule here
// (iptables, else iptables-legacy: nft may be refused inside containers).
// runID distinguishes this run's rules.
func NewFirewall(ctx context.Context, runID string) (*Firewall, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: not root (euid %d)", ErrNoFirewall, os.Geteuid())
	}
	tag := fmt.Sprintf("%s%d-%s", TagPrefix, os.Getpid(), runID)
	mount, root, err := cgroup2Mount()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoFirewall, err)
	}
	f := &Firewall{tag: tag, cgMount: mount, cgRoot: root, run: tag}
	if err := os.Mkdir(filepath.Join(mount, f.run), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("%w: make cgroup: %v", ErrNoFirewall, err)
	}
	var why []string
	for _, name := range []string{"iptables", "iptables-legacy"} {
		bin, err := exec.LookPath(name)
		if err != nil {
			why = append(why, name+": not installed")
			continue
		}
		f.bin = bin
		probe := [][]string{
			append([]string{"-t", "mangle", "-I", "OUTPUT"}, f.markArgs(f.matchPath(""), "127.0.0.254", "tcp", "9")...),
			append([]string{"-I", "INPUT"}, f.dropArgs()...),
		}
		var err2 error
		for i, r := range probe {
			if err2 = f.ipt(ctx, r...); err2 != nil {
				for _, added := range probe[:i] {
					_ = f.ipt(ctx, deleteOf(added)...)
				}
				break
			}
		}
		if err2 == nil {
			for _, r := range probe {
				err2 = errors.Join(err2, f.ipt(ctx, deleteOf(r)...))
			}
		}
		if err2 != nil {
			why = append(why, fmt.Sprintf("%s: %v", name, err2))
			continue
		}
		return f, nil
	}
	_ = os.Remove(filepath.Join(mount, f.run))
	return nil, fmt.Errorf("%w: %s", ErrNoFirewall, strings.Join(why, "; "))
}

// cgroup2Mount finds the cgroup2 mount point and its root in
// /proc/self/mountinfo.
func cgroup2Mount() (mount, root string, err error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", "", fmt.Errorf("no cgroup v2: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		f := strings.Fields(pre)
		if len(f) >= 5 {
			return f[4], f[3], nil
		}
	}
	return "", "", errors.New("no cgroup v2 hierarchy mounted (per-process iptables matching needs one)")
}

// matchPath is the --path of a node's cgroup ("" for the run's own).
func (f *Firewall) matchPath(node string) string {
	return filepath.Join(f.cgRoot, f.run, node)
}

// Cgroup makes the cgroup a node must start in (ProcConfig.Cgroup) and
// returns its directory.
func (f *Firewall) Cgroup(node string) (string, error) {
	dir := filepath.Join(f.cgMount, f.run, node)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("harness: cgroup of %s: %w", node, err)
	}
	return dir, nil
}

// Close removes this run's rules and cgroups. The nodes must have exited.
func (f *Firewall) Close(ctx context.Context) error {
	err := f.Heal(ctx)
	return errors.Join(err, removeCgroupTree(filepath.Join(f.cgMount, f.run)))
}

func removeCgroupTree(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	var errs []error
	for _, e := range ents {
		if e.IsDir() {
			errs = append(errs, removeCgroupTree(filepath.Join(dir, e.Name())))
		}
	}
	// A cgroup's control files vanish with it: rmdir, not RemoveAll.
	if err := syscall.Rmdir(dir); err != nil && !errors.Is(err, syscall.ENOENT) {
		errs = append(errs, fmt.Errorf("harness: remove cgroup %s: %w", dir, err))
	}
	return errors.Join(errs...)
}

// Backend is the iptables binary in use.
func (f *Firewall) Backend() string { return f.bin }

// Tag is the comment on this run's rules.
func (f *Firewall) Tag() string { return f.tag }

func (f *Firewall) ipt(ctx context.Context, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, f.bin, append([]string{"-w", "5"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", f.bin, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// rules lists the INPUT and OUTPUT rules (iptables -S form) whose tag satisfies keep.
func (f *Firewall) rules(ctx context.Context, keep func(tag string) bool) ([][]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var rules [][]string
	for _, tc := range [][2]string{{"filter", "INPUT"}, {"filter", "OUTPUT"}, {"mangle", "OUTPUT"}} {
		b, err := exec.CommandContext(ctx, f.bin, "-w", "5", "-t", tc[0], "-S", tc[1]).Output()
		if err != nil {
			return nil, fmt.Errorf("%s -t %s -S %s: %w", f.bin, tc[0], tc[1], err)
		}
		for _, r := range parseRules(string(b), keep) {
			rules = append(rules, append([]string{"-t", tc[0], "-D"}, r...))
		}
	}
	return rules, nil
}

// deleteOf turns the arguments that added a rule (-I or -A) into those
// that delete it.
func deleteOf(add []string) []string {
	out := slices.Clone(add)
	for i, a := range out {
		if a == "-I" || a == "-A" {
			out[i] = "-D"
			break
		}
	}
	return out
}

// parseRules picks from iptables -S output the rules whose comment
// starts with TagPrefix and satisfies keep, as the arguments that follow
// "-A" (ready for "-D").
func parseRules(out string, keep func(tag string) bool) [][]string {
	var rules [][]string
	for _, line := range strings.Split(string(out), "\n") {
		fs := strings.Fields(line)
		if len(fs) < 2 || fs[0] != "-A" {
			continue
		}
		// -S quotes some values (a cgroup path); none of ours holds a
		// space, so unquoting field by field gives back the arguments.
		for i := range fs {
			fs[i] = strings.Trim(fs[i], `"`)
		}
		for i := 0; i+1 < len(fs); i++ {
			if fs[i] == "--comment" {
				if tag := fs[i+1]; strings.HasPrefix(tag, TagPrefix) && keep(tag) {
					rules = append(rules, fs[1:])
				}
				break
			}
		}
	}
	return rules
}

func (f *Firewall) remove(ctx context.Context, keep func(tag string) bool) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rules, err := f.rules(ctx, keep)
	if err != nil {
		return 0, err
	}
	var errs []error
	for _, r := range rules {
		if err := f.ipt(ctx, r...); err != nil {
			errs = append(errs, err)
		}
	}
	return len(rules) - len(errs), errors.Join(errs...)
}

// Sweep removes rules left by earlier runs whose process no longer exists
// (a run killed before its cleanup). It returns how many it removed.
func (f *Firewall) Sweep(ctx context.Context) (int, error) {
	n, err := f.remove(ctx, stale)
	ents, _ := os.ReadDir(f.cgMount)
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), TagPrefix) && stale(e.Name()) {
			err = errors.Join(err, removeCgroupTree(filepath.Join(f.cgMount, e.Name())))
		}
	}
	return n, err
}

// stale reports whether a tag belongs to a process that no longer exists.
func stale(tag string) bool {
	pidStr, _, _ := strings.Cut(strings.TrimPrefix(tag, TagPrefix), "-")
	pid, err := strconv.Atoi(pidStr)
	if err != nil || pid <= 0 {
		return true // not of our making, but with our prefix: stale
	}
	return pid != os.Getpid() && errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// Heal removes every rule of this run.
func (f *Firewall) Heal(ctx context.Context) error {
	_, err := f.remove(ctx, func(tag string) bool { return tag == f.tag })
	f.mu.Lock()
	f.dropInstalled = false
	f.mu.Unlock()
	return err
}

// Count is how many rules of this run are in place.
func (f *Firewall) Count(ctx context.Context) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rules, err := f.rules(ctx, func(tag string) bool { return tag == f.tag })
	return len(rules), err
}

// Mark and MarkMask tag the packets a cut drops: mangle OUTPUT marks them
// (the only place that still knows the sending process's cgroup), and
// one filter INPUT rule drops what carries the mark, so a cut is silent
// (the sender times out, as across a real network) rather than an
// immediate EPERM from a DROP in OUTPUT.
const (
	Mark     = 0x4b560000
	MarkMask = 0xffff0000
)

func (f *Firewall) markArgs(cgroupPath, host, proto, ports string) []string {
	return []string{"-m", "cgroup", "--path", cgroupPath, "-d", host, "-p", proto, "-m", "multiport", "--dports", ports,
		"-m", "comment", "--comment", f.tag, "-j", "MARK", "--set-xmark", fmt.Sprintf("%#x/%#x", Mark, MarkMask)}
}

func (f *Firewall) dropArgs() []string {
	return []string{"-m", "mark", "--mark", fmt.Sprintf("%#x/%#x", Mark, MarkMask), "-m", "comment", "--comment", f.tag, "-j", "DROP"}
}

// Drop cuts the link from a to b: every packet a sends to b's listening
// ports (its requests on the connections it opens, its gossip, and its
// acknowledgements of b's answers) vanishes. Answers b sends on
// connections a opened still leave b, but nothing a asks arrives. Call
// Drop both ways for a partition. a must run in Cgroup(a.ID).
func (f *Firewall) Drop(ctx context.Context, a, b Endpoint) error {
	if len(b.Ports) == 0 || len(b.Ports) > 15 {
		return fmt.Errorf("harness: drop %s -> %s: need 1..15 ports (%v)", a.ID, b.ID, b.Ports)
	}
	ps := make([]string, len(b.Ports))
	for i, p := range b.Ports {
		ps[i] = strconv.Itoa(p)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.dropInstalled {
		if err := f.ipt(ctx, append([]string{"-I", "INPUT"}, f.dropArgs()...)...); err != nil {
			return err
		}
		f.dropInstalled = true
	}
	for _, proto := range []string{"tcp", "udp"} {
		if err := f.ipt(ctx, append([]string{"-t", "mangle", "-I", "OUTPUT"}, f.markArgs(f.matchPath(a.ID), b.Host, proto, strings.Join(ps, ","))...)...); err != nil {
			return err
		}
	}
	return nil
}
