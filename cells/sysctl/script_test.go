package sysctl_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"

	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/sysctl"
)

func TestScript(t *testing.T) {
	scripttest.Test(t, context.Background(), newEngine, nil, "testdata/*.txtar")
}

// newEngine points the sysctl cell at a temporary proc dir that the script
// reads and writes with proc/write and proc/read, playing the kernel.
func newEngine(t testing.TB, args []string) *script.Engine {
	procFS := t.TempDir()
	h := celltest.New(sysctl.Cell)
	hive.AddConfigOverride(h, func(c *sysctl.Config) { c.ProcFS = procFS })
	file := func(name string) string {
		return filepath.Join(procFS, "sys", strings.ReplaceAll(name, ".", "/"))
	}
	return celltest.ScriptEngine(t, h, args, map[string]script.Cmd{
		"proc/write": script.Command(
			script.CmdUsage{Summary: "Set a kernel parameter in the fake procfs", Args: "name value"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 2 {
					return nil, errors.New("want name and value")
				}
				if err := os.RemoveAll(file(args[0])); err != nil {
					return nil, err
				}
				if err := os.MkdirAll(filepath.Dir(file(args[0])), 0o755); err != nil {
					return nil, err
				}
				return nil, os.WriteFile(file(args[0]), []byte(args[1]+"\n"), 0o644)
			}),
		"proc/read": script.Command(
			script.CmdUsage{Summary: "Print a kernel parameter of the fake procfs", Args: "name"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				b, err := os.ReadFile(file(args[0]))
				return func(*script.State) (string, string, error) { return string(b), "", err }, nil
			}),
		"proc/break": script.Command(
			script.CmdUsage{Summary: "Make a kernel parameter unreadable and unwritable", Args: "name"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				// A directory in place of the file fails every read and
				// write, even as root.
				if err := os.RemoveAll(file(args[0])); err != nil {
					return nil, err
				}
				return nil, os.MkdirAll(file(args[0]), 0o755)
			}),
	})
}
