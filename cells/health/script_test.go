package health_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/pkg/apiv1"
)

func TestScript(t *testing.T) {
	scripttest.Test(t, context.Background(), newEngine, nil, "testdata/*.txtar")
}

// newEngine builds a hive with a test module "pod-sync" that reports what the
// script tells it to and holds a readiness barrier "pod-restore".
func newEngine(t testing.TB, args []string) *script.Engine {
	var (
		moduleHealth cell.Health
		scopes       = map[string]cell.Health{}
		restoreDone  func()
		readiness    *health.Readiness
		db           *statedb.DB
		statusTable  statedb.Table[*health.Status]
	)
	h := celltest.New(
		cell.Module("pod-sync", "Test module reporting what the script says",
			cell.Invoke(func(h cell.Health, r *health.Readiness, db_ *statedb.DB, tbl statedb.Table[*health.Status]) {
				moduleHealth, readiness, db, statusTable = h, r, db_, tbl
				restoreDone = r.Add("pod-restore")
			}),
		),
	)
	scope := func(name string) cell.Health {
		if name == "." {
			return moduleHealth
		}
		if _, ok := scopes[name]; !ok {
			scopes[name] = moduleHealth.NewScope(name)
		}
		return scopes[name]
	}
	cmds := map[string]script.Cmd{
		"report": script.Command(
			script.CmdUsage{Summary: "Report health on a scope of pod-sync ('.' for the module)", Args: "scope level message"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 3 {
					return nil, errors.New("want scope, level and message")
				}
				hl := scope(args[0])
				switch cell.Level(args[1]) {
				case cell.StatusOK:
					hl.OK(args[2])
				case cell.StatusDegraded:
					hl.Degraded(args[2], errors.New("boom"))
				case cell.StatusStopped:
					hl.Stopped(args[2])
				default:
					return nil, fmt.Errorf("unknown level %q", args[1])
				}
				return nil, nil
			}),
		"close": script.Command(
			script.CmdUsage{Summary: "Close a scope of pod-sync", Args: "scope"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				scope(args[0]).Close()
				return nil, nil
			}),
		"restore-done": script.Command(
			script.CmdUsage{Summary: "Complete the pod-restore barrier"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				restoreDone()
				return nil, nil
			}),
		"healthz": script.Command(
			script.CmdUsage{Summary: "Print the readiness status"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				hz, _ := readiness.Status()
				return stdout(fmt.Sprintf("started=%v ready=%v pending=%s\n", hz.Started, hz.Ready, strings.Join(hz.Pending, ","))), nil
			}),
		"tree": script.Command(
			script.CmdUsage{Summary: "Print the health tree as GET /v1/health returns it, without times"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				snap := health.Snapshot(db, statusTable, readiness)
				var b strings.Builder
				var print func(indent string, nodes []apiv1.HealthNode)
				print = func(indent string, nodes []apiv1.HealthNode) {
					for _, n := range nodes {
						if n.Name == "health" {
							continue // the health module's own probe server row
						}
						fmt.Fprintf(&b, "%s%s %s %q\n", indent, n.Name, n.Level, n.Message)
						print(indent+"  ", n.Children)
					}
				}
				fmt.Fprintf(&b, "level %s\n", snap.Level)
				print("", snap.Modules)
				return stdout(b.String()), nil
			}),
	}
	return celltest.ScriptEngine(t, h, args, cmds)
}

func stdout(out string) script.WaitFunc {
	return func(*script.State) (string, string, error) { return out, "", nil }
}

// The tree's JSON is what `agent status -o json` prints: keep its shape.
func TestHealthNodeJSON(t *testing.T) {
	b, err := json.Marshal(apiv1.HealthNode{Name: "job-x", ID: "m.job-x", Level: apiv1.LevelOK})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), `{"name":"job-x","id":"m.job-x","level":"OK"}`; got != want {
		t.Fatalf("JSON of a bare node:\n got %s\nwant %s", got, want)
	}
}
