package ipam_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/ipam"
)

func TestScript(t *testing.T) {
	scripttest.Test(t, context.Background(), newEngine, nil, "testdata/*.txtar")
}

// newEngine runs the ipam cell with a restorer, "test-restore", that the
// script completes with restore/done.
func newEngine(t testing.TB, args []string) *script.Engine {
	var (
		alloc       *ipam.IPAM
		restoreDone func()
	)
	h := celltest.New(daemon.Cell, ipam.Cell,
		cell.Module("test-restorer", "Test restorer",
			cell.Invoke(func(i *ipam.IPAM) {
				alloc = i
				restoreDone = i.RegisterRestorer("test-restore")
			}),
		),
	)
	dir := t.TempDir()
	hive.AddConfigOverride(h, func(c *daemon.Config) {
		c.StateDir, c.RunDir = filepath.Join(dir, "state"), filepath.Join(dir, "run")
	})
	return celltest.ScriptEngine(t, h, args, map[string]script.Cmd{
		"ipam/allocate": script.Command(
			script.CmdUsage{
				Summary: "Allocate an address for an owner and print it",
				Args:    "owner",
				Flags: func(fs *pflag.FlagSet) {
					fs.String("family", "ipv4", "Family of the next free address")
					fs.String("ip", "", "Allocate this address")
					fs.Bool("reserved", false, "Reserve it, as POST /v1/ipam does")
					fs.Bool("no-wait", false, "Fail instead of waiting for the IPAM to be ready")
				},
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, errors.New("want an owner")
				}
				family, _ := s.Flags.GetString("family")
				ipFlag, _ := s.Flags.GetString("ip")
				reserved, _ := s.Flags.GetBool("reserved")
				noWait, _ := s.Flags.GetBool("no-wait")
				req := ipam.Request{Owner: args[0], Family: ipam.Family(family), Reserved: reserved}
				if ipFlag != "" {
					ip, err := netip.ParseAddr(ipFlag)
					if err != nil {
						return nil, err
					}
					req.IP = ip
				}
				ctx := s.Context()
				if noWait {
					cancelled, cancel := context.WithCancel(ctx)
					cancel()
					ctx = cancelled
				}
				a, err := alloc.Allocate(ctx, req)
				if err != nil {
					return failed(err), nil
				}
				return stdout(a.IP.String() + "\n"), nil
			}),
		"ipam/release": script.Command(
			script.CmdUsage{Summary: "Release an owner's address", Args: "ip owner"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 2 {
					return nil, errors.New("want an address and its owner")
				}
				ip, err := netip.ParseAddr(args[0])
				if err != nil {
					return nil, err
				}
				released, err := alloc.Release(ip, args[1])
				if err != nil {
					return failed(err), nil
				}
				return stdout(fmt.Sprintf("released=%v\n", released)), nil
			}),
		"ipam/release-owner": script.Command(
			script.CmdUsage{Summary: "Release every address of an owner and print them", Args: "owner"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				released, err := alloc.ReleaseOwner(args[0])
				if err != nil {
					return failed(err), nil
				}
				return stdout(fmt.Sprintln(released)), nil
			}),
		"restore/claim": script.Command(
			script.CmdUsage{Summary: "Claim an address for a restored owner", Args: "ip owner"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 2 {
					return nil, errors.New("want an address and its owner")
				}
				ip, err := netip.ParseAddr(args[0])
				if err != nil {
					return nil, err
				}
				if err := alloc.Claim(ip, args[1]); err != nil {
					return failed(err), nil
				}
				return nil, nil
			}),
		"restore/done": script.Command(
			script.CmdUsage{Summary: "Complete the test-restore restorer"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				restoreDone()
				return nil, nil
			}),
	})
}

func stdout(out string) script.WaitFunc {
	return func(*script.State) (string, string, error) { return out, "", nil }
}

// failed reports err on stderr, where the script matches it.
func failed(err error) script.WaitFunc {
	return func(*script.State) (string, string, error) { return "", err.Error() + "\n", err }
}
