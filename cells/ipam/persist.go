package ipam

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cellium/cellium/pkg/statefile"
)

// fileSuffix ends the name of an allocation's state file, <ip>.json.
const fileSuffix = ".json"

// allocationFile is an allocation on disk: <state-dir>/ipam/<ip>.json.
type allocationFile struct {
	IP    netip.Addr `json:"ip"`
	Owner string     `json:"owner"`
	// State is in-use or reserved: an in-use allocation is unclaimed
	// after a restart until its endpoint is restored.
	State State     `json:"state"`
	Since time.Time `json:"since"`
}

// store keeps one state file per allocation, so that an address handed out
// for a CNI ADD that dies half way is still known after a restart.
type store struct {
	log *slog.Logger
	// dir holds the allocations; invalid receives files that do not parse.
	dir, invalid string
	// moved says, for each file load moved aside, where to and why.
	moved []string
}

func newStore(log *slog.Logger, stateDir string) *store {
	return &store{log: log, dir: filepath.Join(stateDir, "ipam"), invalid: filepath.Join(stateDir, "ipam-invalid")}
}

func (s *store) path(ip netip.Addr) string { return filepath.Join(s.dir, ip.String()+fileSuffix) }

// write writes a's file; synced, it is on disk when write returns, else
// only safe from a crash of the agent (see Request.Recorded).
func (s *store) write(a *Allocation, synced bool) error {
	state := a.State
	if state == Unclaimed {
		state = InUse
	}
	data, err := json.Marshal(allocationFile{IP: a.IP, Owner: a.Owner, State: state, Since: a.Since})
	if err != nil {
		return err
	}
	if !synced {
		return statefile.WriteUnsynced(s.path(a.IP), data)
	}
	return statefile.Write(s.path(a.IP), data)
}

func (s *store) remove(ip netip.Addr) error { return statefile.Remove(s.path(ip)) }

// load reads every allocation. It removes the temporary files of writes
// that a crash interrupted, and moves files that do not parse to the
// invalid directory, logging why. In-use allocations come back unclaimed.
func (s *store) load() ([]*Allocation, error) {
	if err := statefile.MkdirAll(s.dir); err != nil {
		return nil, err
	}
	removed, err := statefile.RemoveTemps(s.dir)
	if err != nil {
		return nil, err
	}
	for _, path := range removed {
		s.log.Info("Removed temporary IPAM state file of an interrupted write", "file", path)
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("read IPAM state: %w", err)
	}
	var out []*Allocation
	for _, e := range entries {
		path := filepath.Join(s.dir, e.Name())
		a, err := s.parse(path, e)
		if err != nil {
			if err := s.quarantine(path, err); err != nil {
				return nil, err
			}
			continue
		}
		out = append(out, a)
	}
	return out, nil
}

func (s *store) parse(path string, e fs.DirEntry) (*Allocation, error) {
	if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), fileSuffix) {
		return nil, errors.New("not an allocation file (<ip>.json)")
	}
	data, err := statefile.ReadRegular(path)
	if err != nil {
		return nil, err
	}
	return parseAllocationFile(e.Name(), data)
}

// parseAllocationFile parses the allocation file named name.
func parseAllocationFile(name string, data []byte) (*Allocation, error) {
	var f allocationFile
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("more than one JSON value")
	}
	switch {
	case !f.IP.IsValid():
		return nil, errors.New(`no "ip"`)
	case f.IP.Zone() != "":
		return nil, fmt.Errorf("address %s has a zone", f.IP)
	case name != f.IP.String()+fileSuffix:
		return nil, fmt.Errorf("file name does not match its ip %s", f.IP)
	case f.Owner == "":
		return nil, errors.New(`no "owner"`)
	case validOwner(f.Owner) != nil:
		return nil, validOwner(f.Owner)
	case f.State != InUse && f.State != Reserved:
		return nil, fmt.Errorf("invalid state %q: want %s or %s", f.State, InUse, Reserved)
	}
	state := f.State
	if state == InUse {
		state = Unclaimed
	}
	return &Allocation{IP: f.IP, Owner: f.Owner, State: state, Since: f.Since}, nil
}

// quarantine moves a file that cannot be used out of the way, keeping it
// for whoever investigates.
func (s *store) quarantine(path string, why error) error {
	to, err := statefile.MoveAside(path, s.invalid)
	if err == nil {
		s.moved = append(s.moved, fmt.Sprintf("%s moved to %s: %v", path, to, why))
	}
	s.log.Error("Invalid IPAM state file, moved aside; its address is not reserved",
		"file", path, "error", why, "moved-to", to)
	return err
}
