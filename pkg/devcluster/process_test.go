package devcluster

import (
	"context"
	"os/exec"
	"testing"
)

// WaitAgentExit waits as long as its context allows, a context without a
// deadline too: it returns once the agent has exited by itself.
func TestWaitAgentExitWithoutDeadline(t *testing.T) {
	dir := t.TempDir()
	// The "agent" is a cat that exits once its input is closed.
	cat := exec.Command("cat")
	in, err := cat.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cat.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Process.Kill(); cat.Wait() })
	s := plan(Options{Name: "dev", Dir: dir, Nodes: 1, BPFRoot: "/sys/fs/bpf"}, "/sys/fs/cgroup")
	s.Nodes[0].Agent.PID = cat.Process.Pid
	if s.Nodes[0].Agent.StartTime, err = startTime(cat.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := s.save(); err != nil {
		t.Fatal(err)
	}
	c, err := Load(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Nodes[0].Agent.Alive() {
		t.Fatal("the agent's stand-in is not alive before its input is closed")
	}
	in.Close()
	if err := c.WaitAgentExit(context.Background(), "node-1"); err != nil {
		t.Fatalf("WaitAgentExit without a deadline: %v", err)
	}
	if s.Nodes[0].Agent.Alive() {
		t.Fatal("WaitAgentExit returned while the agent runs")
	}
}
