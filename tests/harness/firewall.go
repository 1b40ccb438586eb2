package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
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

// Endpoint is one node as the firewall sees it: its host and the ports it
// listens on (TCP and UDP alike).
type Endpoint struct {
	Host  string
	Ports []int
}

// Firewall cuts links between loopback nodes with iptables rules in the
// INPUT chain, each tagged with the comment TagPrefix+PID-RUNID, so that
// Heal removes exactly the rules of this run, and Sweep those of runs whose
// process is gone. Rules match the nodes' ports as well as their hosts, so
// other processes bound to the same loopback addresses (another suite) are
// not cut off.
type Firewall struct {
	bin string
	tag string

	mu sync.Mutex
}

// NewFirewall picks the iptables backend that works here (iptables, else
// iptables-legacy: nft may be refused inside containers) and tests that it
// can add and delete a tagged rule. runID distinguishes this run's rules.
func NewFirewall(ctx context.Context, runID string) (*Firewall, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: not root (euid %d)", ErrNoFirewall, os.Geteuid())
	}
	tag := fmt.Sprintf("%s%d-%s", TagPrefix, os.Getpid(), runID)
	var why []string
	for _, name := range []string{"iptables", "iptables-legacy"} {
		bin, err := exec.LookPath(name)
		if err != nil {
			why = append(why, name+": not installed")
			continue
		}
		f := &Firewall{bin: bin, tag: tag}
		probe := []string{"-s", "127.0.0.254", "-d", "127.0.0.254", "-p", "tcp", "-m", "multiport", "--dports", "9", "-m", "comment", "--comment", tag, "-j", "DROP"}
		if err := f.ipt(ctx, append([]string{"-I", "INPUT"}, probe...)...); err != nil {
			why = append(why, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		if err := f.ipt(ctx, append([]string{"-D", "INPUT"}, probe...)...); err != nil {
			why = append(why, fmt.Sprintf("%s: delete: %v", name, err))
			continue
		}
		return f, nil
	}
	return nil, fmt.Errorf("%w: %s", ErrNoFirewall, strings.Join(why, "; "))
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

// rules lists the INPUT rules (iptables -S form) whose tag satisfies keep.
func (f *Firewall) rules(ctx context.Context, keep func(tag string) bool) ([][]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, f.bin, "-w", "5", "-S", "INPUT").Output()
	if err != nil {
		return nil, fmt.Errorf("%s -S INPUT: %w", f.bin, err)
	}
	var rules [][]string
	for _, line := range strings.Split(string(out), "\n") {
		fs := strings.Fields(line)
		if len(fs) < 2 || fs[0] != "-A" {
			continue
		}
		for i := 0; i+1 < len(fs); i++ {
			if fs[i] == "--comment" {
				tag := strings.Trim(fs[i+1], `"`)
				if strings.HasPrefix(tag, TagPrefix) && keep(tag) {
					fs[i+1] = tag
					rules = append(rules, fs[1:])
				}
				break
			}
		}
	}
	return rules, nil
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
		if err := f.ipt(ctx, append([]string{"-D"}, r...)...); err != nil {
			errs = append(errs, err)
		}
	}
	return len(rules) - len(errs), errors.Join(errs...)
}

// Sweep removes rules left by earlier runs whose process no longer exists
// (a run killed before its cleanup). It returns how many it removed.
func (f *Firewall) Sweep(ctx context.Context) (int, error) {
	return f.remove(ctx, func(tag string) bool {
		pidStr, _, _ := strings.Cut(strings.TrimPrefix(tag, TagPrefix), "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 {
			return true // not of our making, but with our prefix: stale
		}
		return pid != os.Getpid() && errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
	})
}

// Heal removes every rule of this run.
func (f *Firewall) Heal(ctx context.Context) error {
	_, err := f.remove(ctx, func(tag string) bool { return tag == f.tag })
	return err
}

// Count is how many rules of this run are in place.
func (f *Firewall) Count(ctx context.Context) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rules, err := f.rules(ctx, func(tag string) bool { return tag == f.tag })
	return len(rules), err
}

// Drop makes every packet from a to b vanish: connections a opens to b,
// and a's answers on connections b opened. Traffic from b to a still
// flows (a one-way cut); call Drop both ways for a partition.
func (f *Firewall) Drop(ctx context.Context, a, b Endpoint) error {
	if len(a.Ports) == 0 || len(b.Ports) == 0 || len(a.Ports) > 15 || len(b.Ports) > 15 {
		return fmt.Errorf("harness: drop %s -> %s: need 1..15 ports each (%v, %v)", a.Host, b.Host, a.Ports, b.Ports)
	}
	join := func(ps []int) string {
		s := make([]string, len(ps))
		for i, p := range ps {
			s[i] = strconv.Itoa(p)
		}
		return strings.Join(s, ",")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, proto := range []string{"tcp", "udp"} {
		for _, m := range [][2]string{{"--dports", join(b.Ports)}, {"--sports", join(a.Ports)}} {
			if err := f.ipt(ctx, "-I", "INPUT", "-s", a.Host, "-d", b.Host, "-p", proto, "-m", "multiport", m[0], m[1],
				"-m", "comment", "--comment", f.tag, "-j", "DROP"); err != nil {
				return err
			}
		}
	}
	return nil
}
