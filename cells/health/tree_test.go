package health

import (
	"testing"

	"github.com/cilium/hive/cell"
)

func TestBuildTreeLevels(t *testing.T) {
	row := func(level cell.Level, path ...string) *Status { return &Status{Path: path, Level: level} }
	tests := []struct {
		name       string
		rows       []*Status
		wantModule cell.Level
		wantWorst  cell.Level
	}{
		{"no rows", nil, "", cell.StatusUnknown},
		{"module never reported", []*Status{row(cell.StatusUnknown, "m")}, cell.StatusUnknown, cell.StatusUnknown},
		{"unreported module takes its jobs' level",
			[]*Status{row(cell.StatusUnknown, "m"), row(cell.StatusOK, "m", "job")}, cell.StatusOK, cell.StatusOK},
		{"a stopped one-shot job does not hide a running one",
			[]*Status{row(cell.StatusStopped, "m", "a"), row(cell.StatusOK, "m", "b")}, cell.StatusOK, cell.StatusOK},
		{"degraded grandchild degrades the module",
			[]*Status{row(cell.StatusOK, "m"), row(cell.StatusOK, "m", "a"), row(cell.StatusDegraded, "m", "a", "x")},
			cell.StatusDegraded, cell.StatusDegraded},
		{"a module's own degraded report wins over healthy jobs",
			[]*Status{row(cell.StatusDegraded, "m"), row(cell.StatusOK, "m", "a")}, cell.StatusDegraded, cell.StatusDegraded},
		{"scope reported without a row for its parent",
			[]*Status{row(cell.StatusOK, "m", "a")}, cell.StatusOK, cell.StatusOK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			nodes, worst := buildTree(tc.rows)
			if worst != tc.wantWorst {
				t.Errorf("worst = %s, want %s", worst, tc.wantWorst)
			}
			if tc.wantModule == "" {
				if len(nodes) != 0 {
					t.Errorf("got %d modules, want none", len(nodes))
				}
				return
			}
			if len(nodes) != 1 || nodes[0].Name != "m" {
				t.Fatalf("want one module m, got %+v", nodes)
			}
			if got := cell.Level(nodes[0].Level); got != tc.wantModule {
				t.Errorf("module level = %s, want %s", got, tc.wantModule)
			}
		})
	}
}
