package devcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/netnsrun"
)

// stopGrace is how long a process has to exit after SIGTERM before it gets
// SIGKILL.
const stopGrace = 10 * time.Second

// startDetached starts argv in the network namespace at netnsPath, in a
// session of its own, stdin from /dev/null and its output appended to
// logPath, and returns it once it runs. Unless dieWithCaller, it outlives
// the calling process.
func startDetached(netnsPath string, argv []string, logPath string, dieWithCaller bool) (Process, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return Process{}, fmt.Errorf("open log: %w", err)
	}
	defer log.Close()
	fmt.Fprintf(log, "--- %s cellium-dev cluster: starting %s\n", time.Now().UTC().Format(time.RFC3339), strings.Join(argv, " "))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = environ()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if dieWithCaller {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	// The child forks from a thread in the namespace. The kernel sends
	// Pdeathsig when the thread that forked the child ends, not the
	// process: with dieWithCaller that thread stays, waiting, as long as
	// the child runs. Either way Wait reaps it, should it end while this
	// process runs.
	started := make(chan error, 1)
	go func() {
		entered := false
		err := netnsrun.Do(netnsPath, func() error {
			entered = true
			err := cmd.Start()
			started <- err
			if err == nil && dieWithCaller {
				cmd.Wait()
			}
			return nil
		})
		if !entered {
			started <- err
			return
		}
		if cmd.Process != nil && !dieWithCaller {
			cmd.Wait()
		}
	}()
	if err := <-started; err != nil {
		return Process{}, fmt.Errorf("start %s: %w", argv[0], err)
	}
	p := Process{PID: cmd.Process.Pid}
	// A child that died at once has no start time left to read; then it
	// is simply not alive.
	p.StartTime, _ = startTime(p.PID)
	return p, nil
}

// environ is the environment of the cluster's processes: the caller's,
// without AGENT_* variables, which would set flags the cluster does not
// choose.
func environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AGENT_") {
			env = append(env, kv)
		}
	}
	return env
}

// procStat is what /proc/PID/stat says: the process state (R, S, Z, ...)
// and its start time.
func procStat(pid int) (state byte, start uint64, err error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// "pid (comm) S ppid ...": comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: no ')'", pid)
	}
	fields := strings.Fields(string(data[i+1:]))
	// fields[0] is field 3 (state); starttime is field 22.
	if len(fields) < 20 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields)+2)
	}
	start, err = strconv.ParseUint(fields[19], 10, 64)
	return fields[0][0], start, err
}

func startTime(pid int) (uint64, error) {
	_, start, err := procStat(pid)
	return start, err
}

// Alive says whether the process runs: its PID exists, is not a zombie,
// and started when this one did (it is not a later process with its PID).
func (p Process) Alive() bool {
	if p.PID <= 0 {
		return false
	}
	state, start, err := procStat(p.PID)
	return err == nil && state != 'Z' && state != 'X' && start == p.StartTime
}

// signal sends sig to the process if it is the one that was started.
func (p Process) signal(sig syscall.Signal) error {
	if !p.Alive() {
		return nil
	}
	if err := unix.Kill(p.PID, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signal %s to %d: %w", sig, p.PID, err)
	}
	return nil
}

// waitExit polls until the process is gone, timeout at most.
func (p Process) waitExit(ctx context.Context, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return p.waitGone(ctx)
}

// waitGone polls until the process is gone or ctx ends.
func (p Process) waitGone(ctx context.Context) bool {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for p.Alive() {
		select {
		case <-ctx.Done():
			return !p.Alive()
		case <-tick.C:
		}
	}
	return true
}

// stop ends the process: SIGTERM, then SIGKILL if it is still there after
// grace. It returns once the process is gone.
func (p Process) stop(ctx context.Context, grace time.Duration) error {
	if err := p.signal(syscall.SIGTERM); err != nil {
		return err
	}
	if p.waitExit(ctx, grace) {
		return nil
	}
	return p.kill(ctx)
}

// kill ends the process with SIGKILL, as a crash would, and returns once it
// is gone.
func (p Process) kill(ctx context.Context) error {
	if err := p.signal(syscall.SIGKILL); err != nil {
		return err
	}
	if !p.waitExit(ctx, 10*time.Second) {
		return fmt.Errorf("process %d still runs 10s after SIGKILL", p.PID)
	}
	return nil
}

// tail is the last lines of a log file, for errors.
func tail(path string, lines int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	const maxBytes = 16 << 10
	st, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(log: %v)", err)
	}
	off := max(st.Size()-maxBytes, 0)
	buf := make([]byte, st.Size()-off)
	n, _ := f.ReadAt(buf, off)
	all := strings.Split(strings.TrimRight(string(buf[:n]), "\n"), "\n")
	if off > 0 && len(all) > 1 {
		all = all[1:] // cut mid-line
	}
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}
