package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// agentProc is a running `agent run`, with its JSON log lines.
type agentProc struct {
	t            *testing.T
	cmd          *exec.Cmd
	logs         chan map[string]any
	exited       chan error
	startedHooks []string
}

// startAgent starts `agent run flags...`; it is killed when the test ends
// if it is still running.
func startAgent(t *testing.T, flags ...string) *agentProc {
	t.Helper()
	cmd := exec.Command(agentBin, append([]string{"run"}, flags...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &agentProc{t: t, cmd: cmd, logs: make(chan map[string]any, 4096), exited: make(chan error, 1)}
	// Logs go to a pipe, so they are JSON.
	go func() {
		defer close(p.logs)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var line map[string]any
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
				line = map[string]any{"msg": "NOT JSON: " + sc.Text()}
			}
			p.logs <- line
		}
	}()
	go func() { p.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// waitFor reads the log until a line with msg; an error line, or a line
// that is not JSON, fails the test.
func (p *agentProc) waitFor(msg string) {
	p.t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case line, ok := <-p.logs:
			if !ok {
				p.t.Fatalf("agent exited before logging %q", msg)
			}
			if m, _ := line["msg"].(string); strings.HasPrefix(m, "NOT JSON") {
				p.t.Fatalf("log line is not JSON on a pipe: %s", m)
			}
			if line["msg"] == "Start hook executed" {
				p.startedHooks = append(p.startedHooks, fmt.Sprint(line["function"]))
			}
			if line["level"] == "ERROR" {
				p.t.Errorf("agent logged an error: %v", line)
			}
			if line["msg"] == msg {
				return
			}
		case <-timeout:
			p.t.Fatalf("agent did not log %q within 60s", msg)
		}
	}
}

// stop sends SIGTERM and requires a clean exit within the 5 s a
// kubelet-style stop allows.
func (p *agentProc) stop() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatal(err)
	}
	go func() {
		for range p.logs {
		}
	}()
	select {
	case err := <-p.exited:
		p.exited <- err // for the cleanup
		if err != nil {
			p.t.Fatalf("agent exit after SIGTERM: %v", err)
		}
	case <-time.After(5 * time.Second):
		p.t.Fatal("agent still running 5s after SIGTERM")
	}
}
