package endpointmaps_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/endpointmaps"
	"github.com/cellium/cellium/cells/internal/celltest"
)

func TestScript(t *testing.T) {
	scripttest.Test(t, context.Background(), newEngine, nil, "testdata/*.txtar")
}

// pruneSignal is the reconcilers' metrics: it tells the script when a prune
// has run.
type pruneSignal struct {
	reconciler.Metrics
	pruned chan struct{}
}

func (p *pruneSignal) PruneDuration(id cell.FullModuleID, name string, d time.Duration) {
	p.Metrics.PruneDuration(id, name, d)
	p.pruned <- struct{}{}
}

// newEngine runs endpoint-maps over an endpoints table that the script
// fills with db/insert, playing the endpoint manager; restore/done
// completes the table's restore initializer.
func newEngine(t testing.TB, args []string) *script.Engine {
	var (
		m           *endpointmaps.EndpointMap
		restoreDone func()
	)
	signal := &pruneSignal{Metrics: reconciler.NewUnpublishedExpVarMetrics(), pruned: make(chan struct{}, 16)}
	h := celltest.New(bpfmaps.Cell, endpointmaps.Cell,
		cell.Module("test-endpoints", "Endpoints table filled by the script",
			cell.Provide(endpointmanager.NewTable, func() reconciler.Metrics { return signal }),
			cell.Invoke(func(db *statedb.DB, tbl statedb.RWTable[*endpointmanager.Endpoint], em *endpointmaps.EndpointMap) {
				m = em
				txn := db.WriteTxn(tbl)
				done := tbl.RegisterInitializer(txn, "endpoint-restore")
				txn.Commit()
				restoreDone = func() {
					txn := db.WriteTxn(tbl)
					done(txn)
					txn.Commit()
				}
			}),
		),
	)
	root := bpfmapstest.Root(t)
	hive.AddConfigOverride(h, func(c *bpfmaps.Config) { c.BPFRoot = root })
	return celltest.ScriptEngine(t, h, args, map[string]script.Cmd{
		"map/put": script.Command(
			script.CmdUsage{Summary: "Put an entry into the endpoint map, as an earlier run left it", Args: "ip endpoint-id ifindex"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 3 {
					return nil, errors.New("want ip, endpoint ID and ifindex")
				}
				ip, err := netip.ParseAddr(args[0])
				if err != nil {
					return nil, err
				}
				id, _ := strconv.Atoi(args[1])
				ifindex, _ := strconv.Atoi(args[2])
				return nil, m.Put(endpointmaps.KeyOf(ip), endpointmaps.EndpointInfo{EndpointID: uint16(id), IfIndex: uint32(ifindex)})
			}),
		"map/dump": script.Command(
			script.CmdUsage{Summary: "Print the endpoint map, sorted by address"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				var lines []string
				err := m.Iterate(func(k endpointmaps.EndpointKey, v endpointmaps.EndpointInfo) bool {
					lines = append(lines, fmt.Sprintf("%s id=%d ifindex=%d mac=%s host-mac=%s\n", k.IP(), v.EndpointID, v.IfIndex,
						endpointmanager.MAC(v.MAC[:]), endpointmanager.MAC(v.HostMAC[:])))
					return true
				})
				slices.Sort(lines)
				return func(*script.State) (string, string, error) { return strings.Join(lines, ""), "", err }, nil
			}),
		"restore/done": script.Command(
			script.CmdUsage{Summary: "Complete the endpoints table's restore initializer"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				restoreDone()
				return nil, nil
			}),
		"prune/wait": script.Command(
			script.CmdUsage{Summary: "Wait for the reconciler's next prune"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				select {
				case <-signal.pruned:
					return nil, nil
				case <-s.Context().Done():
					return nil, s.Context().Err()
				}
			}),
	})
}
