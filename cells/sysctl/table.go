package sysctl

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/cells/internal/tables"
)

// Sysctl is one kernel parameter the agent wants set.
type Sysctl struct {
	// Name is the parameter in sysctl's dotted form, e.g. "net.ipv4.ip_forward".
	Name  string `json:"name" yaml:"name"`
	Value string `json:"value" yaml:"value"`
	// Optional parameters that the kernel does not have (IPv6 turned off,
	// say) are skipped instead of failing.
	Optional bool              `json:"optional,omitempty" yaml:"optional,omitempty"`
	Status   reconciler.Status `json:"status" yaml:"status"`
}

var _ statedb.TableWritable = &Sysctl{}

func (s *Sysctl) TableHeader() []string {
	return []string{"Name", "Value", "Optional", "Status", "Error"}
}

func (s *Sysctl) TableRow() []string {
	optional := ""
	if s.Optional {
		optional = "yes"
	}
	return []string{s.Name, s.Value, optional, s.Status.Kind.String(), s.Status.GetError()}
}

func (s *Sysctl) clone() *Sysctl {
	c := *s
	return &c
}

func (s *Sysctl) setStatus(st reconciler.Status) *Sysctl {
	s.Status = st
	return s
}

func (s *Sysctl) getStatus() reconciler.Status { return s.Status }

// nameRE is a dotted sysctl name: no slashes, no "..", nothing that could
// leave <proc-fs>/sys.
var nameRE = regexp.MustCompile(`^[a-z0-9_-]+(\.[a-z0-9_-]+)+$`)

// path is where the parameter lives under procFS.
func (s *Sysctl) path(procFS string) (string, error) {
	if !nameRE.MatchString(s.Name) {
		return "", fmt.Errorf("invalid sysctl name %q: want dotted lower-case words such as net.ipv4.ip_forward", s.Name)
	}
	return filepath.Join(procFS, "sys", strings.ReplaceAll(s.Name, ".", "/")), nil
}

var (
	// SysctlName indexes the sysctl table by parameter name.
	SysctlName = statedb.Index[*Sysctl, string]{
		Name:       "name",
		FromObject: func(s *Sysctl) index.KeySet { return index.NewKeySet(index.String(s.Name)) },
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     true,
	}
	// SysctlStatus indexes the sysctl table by reconciliation status.
	SysctlStatus = tables.StatusIndex((*Sysctl).getStatus)
)

// TableName is the name of the sysctl table.
const TableName = "sysctl"

func newTable(db *statedb.DB) (statedb.RWTable[*Sysctl], error) {
	return statedb.NewTable(db, TableName, SysctlName, SysctlStatus)
}
