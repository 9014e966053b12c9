package devices_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"

	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/internal/celltest"
)

func TestScript(t *testing.T) {
	scripttest.Test(t, context.Background(), newEngine, nil, "testdata/*.txtar")
}

// newEngine runs the devices cell against a network namespace of the
// test's own, reached through a symlink so that a script can take the
// namespace away (netns/unlink) and give it back (netns/link). The link/...
// and addr/... commands change links and addresses in that namespace.
func newEngine(t testing.TB, args []string) *script.Engine {
	ns := newTestNetns(t)
	nsLink := filepath.Join(t.TempDir(), "netns")
	if err := os.Symlink(ns.path, nsLink); err != nil {
		t.Fatal(err)
	}
	h := celltest.New(devices.Cell)
	hive.AddConfigOverride(h, func(c *devices.Config) { c.DevicesNetns = nsLink })

	cmd := func(summary, usage string, nargs int, run func(args []string) error) script.Cmd {
		return script.Command(
			script.CmdUsage{Summary: summary, Args: usage},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != nargs {
					return nil, fmt.Errorf("want %d arguments: %s", nargs, usage)
				}
				return nil, run(args)
			})
	}
	return celltest.ScriptEngine(t, h, args, map[string]script.Cmd{
		"link/veth": cmd("Add a veth pair", "name peer", 2, func(a []string) error {
			return ns.addVeth(a[0], a[1])
		}),
		"link/up": cmd("Set a link up", "name", 1, func(a []string) error {
			return ns.setUp(a[0], true)
		}),
		"link/down": cmd("Set a link down", "name", 1, func(a []string) error {
			return ns.setUp(a[0], false)
		}),
		"link/rename": cmd("Rename a link (it must be down)", "name new-name", 2, func(a []string) error {
			return ns.rename(a[0], a[1])
		}),
		"link/del": cmd("Delete a link", "name", 1, func(a []string) error {
			return ns.delete(a[0])
		}),
		"addr/add": cmd("Add an address to a link", "name cidr", 2, func(a []string) error {
			return ns.addAddr(a[0], a[1], devices.ScopeGlobal)
		}),
		"addr/add-link-scope": cmd("Add an address of link scope to a link", "name cidr", 2, func(a []string) error {
			return ns.addAddr(a[0], a[1], devices.ScopeLink)
		}),
		"addr/del": cmd("Remove an address from a link", "name cidr", 2, func(a []string) error {
			return ns.delAddr(a[0], a[1])
		}),
		"netns/unlink": cmd("Make the namespace unreachable for the agent", "", 0, func([]string) error {
			return os.Remove(nsLink)
		}),
		"netns/link": cmd("Make the namespace reachable for the agent again", "", 0, func([]string) error {
			return os.Symlink(ns.path, nsLink)
		}),
	})
}
