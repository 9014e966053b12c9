package faultpoint

import (
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// child runs, in a process of its own (the test binary run again with
// FAULTPOINT_CHILD set), the points that scenario names, and says so on
// stdout after each one it survives.
func child(scenario string) {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	switch scenario {
	case "step":
		s := AtStep(log, "b")
		for _, step := range []string{"a", "b", "c"} {
			s.At(step)
			os.Stdout.WriteString("passed " + step + "\n")
		}
	case "count":
		c := After(log, 3, "write")
		for _, w := range []string{"1", "2", "3", "4"} {
			c.Hit("write", w)
			os.Stdout.WriteString("passed " + w + "\n")
		}
	case "unarmed":
		var s Step
		var c *Count
		unarmed := After(log, 0, "write")
		for range 3 {
			s.At("")
			c.Hit()
			unarmed.Hit()
		}
		os.Stdout.WriteString("passed all\n")
	}
	os.Exit(0)
}

func TestMain(m *testing.M) {
	if s := os.Getenv("FAULTPOINT_CHILD"); s != "" {
		child(s)
	}
	os.Exit(m.Run())
}

// run runs scenario in a child process: its stdout, stderr, and whether
// SIGKILL ended it.
func run(t *testing.T, scenario string) (string, string, bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "FAULTPOINT_CHILD="+scenario)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	killed := errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signaled() &&
		exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL
	if err != nil && !killed {
		t.Fatalf("child %s: %v\n%s", scenario, err, stderr.String())
	}
	return stdout.String(), stderr.String(), killed
}

// An armed point kills the process with SIGKILL where it is armed, after
// logging why, and not before; an unarmed one never does.
func TestKillsWhereArmed(t *testing.T) {
	for _, tc := range []struct {
		scenario, stdout string
		killed           bool
		logs             []string
	}{
		{"step", "passed a\n", true, []string{"Test fault point armed", "step=b", "Test fault point: killing the agent at a step"}},
		{"count", "passed 1\npassed 2\n", true, []string{"after=3", "Test fault point: killing the agent after a write", "hit=3 write=3"}},
		{"unarmed", "passed all\n", false, nil},
	} {
		t.Run(tc.scenario, func(t *testing.T) {
			stdout, stderr, killed := run(t, tc.scenario)
			if killed != tc.killed || stdout != tc.stdout {
				t.Fatalf("killed=%v after %q, want killed=%v after %q\n%s", killed, stdout, tc.killed, tc.stdout, stderr)
			}
			for _, want := range tc.logs {
				if !strings.Contains(stderr, want) {
					t.Errorf("log %q does not contain %q", stderr, want)
				}
			}
			if tc.logs == nil && stderr != "" {
				t.Errorf("an unarmed point logged %q", stderr)
			}
		})
	}
}
