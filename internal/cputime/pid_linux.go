//go:build linux

package cputime

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// Of is the CPU time (user + system) process pid has used, from
// /proc/PID/stat.
func Of(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: fields count from the
	// last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("cputime: /proc/%d/stat: %q", pid, s)
	}
	f := strings.Fields(s[i+1:])
	// utime and stime are fields 14 and 15; f[0] is field 3.
	if len(f) < 13 {
		return 0, fmt.Errorf("cputime: /proc/%d/stat: %d fields", pid, len(f)+2)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("cputime: /proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return time.Duration(u+st) * time.Second / clockTicks, nil
}
