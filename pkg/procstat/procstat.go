// Package procstat reads what a process has spent from /proc: its CPU time
// and its resident set, for the benchmarks' figures.
package procstat

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of /proc/PID/stat's times: USER_HZ, 100 on Linux.
const userHZ = 100

func path(pid int, file string) string {
	if pid == 0 {
		return "/proc/self/" + file
	}
	return fmt.Sprintf("/proc/%d/%s", pid, file)
}

// CPU is process pid's user and system CPU time so far (pid 0: this
// process).
func CPU(pid int) (time.Duration, error) {
	p := path(pid, "stat")
	data, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	d, err := parseStat(data)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p, err)
	}
	return d, nil
}

// parseStat is the utime plus stime of a /proc/PID/stat line (proc(5):
// fields 14 and 15).
func parseStat(data []byte) (time.Duration, error) {
	// The command name, in parentheses, may hold spaces and parentheses:
	// the fields start after its last ')'.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("no command name in %.80q", data)
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("%d fields after the command name, want at least 13", len(fields))
	}
	var ticks int64
	for _, f := range fields[11:13] {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("utime or stime %q: %w", f, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// RSS is process pid's resident set in bytes, VmRSS (pid 0: this process).
func RSS(pid int) (uint64, error) {
	p := path(pid, "status")
	data, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	n, err := parseRSS(data)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p, err)
	}
	return n, nil
}

func parseRSS(data []byte) (uint64, error) {
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("VmRSS %q: %w", strings.TrimSpace(v), err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS line")
}

// LoadAverage is the machine's 1-minute load average as /proc/loadavg
// prints it, "?" when it cannot be read: the figure every benchmark line
// carries beside its own.
func LoadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}
