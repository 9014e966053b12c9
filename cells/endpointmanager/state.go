package endpointmanager

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/statefile"
)

// The endpoint state on disk: <state-dir>/endpoints/<id>/endpoint.json.
const (
	endpointsDir  = "endpoints"
	invalidDir    = "endpoints-invalid"
	stateFileName = "endpoint.json"
	stateVersion  = 1
)

// Phase is how far the creation of an endpoint got when its state file was
// written.
type phase string

const (
	// phaseCreating is written before the agent touches the kernel: a
	// restore that finds it undoes whatever the creation made.
	phaseCreating phase = "creating"
	// phaseReady is written before the agent answers the CNI ADD: a
	// restore that finds it brings the endpoint back.
	phaseReady phase = "ready"
	// phaseDeleting is written before a DEL touches the kernel: a restore
	// that finds it finishes the deletion instead of bringing the
	// endpoint back.
	phaseDeleting phase = "deleting"
)

// stateFile is an endpoint on disk. It is the source of truth across
// restarts: the table is rebuilt from it.
type stateFile struct {
	Version      int               `json:"version"`
	Phase        phase             `json:"phase"`
	ID           uint16            `json:"id"`
	ContainerID  string            `json:"containerID"`
	Netns        string            `json:"netns"`
	IfName       string            `json:"ifName"`
	MAC          MAC               `json:"mac,omitempty"`
	IPv4         netip.Addr        `json:"ipv4,omitzero"`
	IPv6         netip.Addr        `json:"ipv6,omitzero"`
	HostIfName   string            `json:"hostIfName"`
	HostIfIndex  int               `json:"hostIfIndex,omitempty"`
	HostMAC      MAC               `json:"hostMAC,omitempty"`
	PodNamespace string            `json:"podNamespace,omitempty"`
	PodName      string            `json:"podName,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	// ServiceAccount and NamespaceLabels, with Labels, make the identity.
	ServiceAccount  string            `json:"serviceAccount,omitempty"`
	NamespaceLabels map[string]string `json:"namespaceLabels,omitempty"`
	Health          bool              `json:"health,omitempty"`
	// Identity is the security identity the endpoint had; a restore
	// acquires it again by labels, and keeps this number meanwhile.
	Identity identity.NumericIdentity `json:"identity,omitempty"`
	Created  time.Time                `json:"created"`
}

func toStateFile(ep *Endpoint, ph phase) stateFile {
	return stateFile{
		Version: stateVersion, Phase: ph, ID: ep.ID, ContainerID: ep.ContainerID, Netns: ep.Netns,
		IfName: ep.IfName, MAC: ep.MAC, IPv4: ep.IPv4, IPv6: ep.IPv6, HostIfName: ep.HostIfName,
		HostIfIndex: ep.HostIfIndex, HostMAC: ep.HostMAC, PodNamespace: ep.PodNamespace,
		PodName: ep.PodName, Labels: ep.Labels, ServiceAccount: ep.ServiceAccount, NamespaceLabels: ep.NamespaceLabels,
		Identity: ep.Identity, Health: ep.Health, Created: ep.Created,
	}
}

func (f *stateFile) endpoint() *Endpoint {
	return &Endpoint{
		ID: f.ID, ContainerID: f.ContainerID, Netns: f.Netns, IfName: f.IfName, MAC: f.MAC,
		IPv4: f.IPv4, IPv6: f.IPv6, HostIfName: f.HostIfName, HostIfIndex: f.HostIfIndex,
		HostMAC: f.HostMAC, PodNamespace: f.PodNamespace, PodName: f.PodName, Labels: f.Labels,
		ServiceAccount: f.ServiceAccount, NamespaceLabels: f.NamespaceLabels, Identity: f.Identity, Health: f.Health, Created: f.Created,
	}
}

// validate checks what a restore relies on.
func (f *stateFile) validate(dirName string) error {
	switch {
	case f.Version != stateVersion:
		return fmt.Errorf("unknown version %d: this agent reads version %d", f.Version, stateVersion)
	case f.Phase != phaseCreating && f.Phase != phaseReady && f.Phase != phaseDeleting:
		return fmt.Errorf("invalid phase %q: want %s, %s or %s", f.Phase, phaseCreating, phaseReady, phaseDeleting)
	case strconv.Itoa(int(f.ID)) != dirName || f.ID == 0:
		return fmt.Errorf("id %d does not match its directory %q", f.ID, dirName)
	case f.HostIfName != HostIfName(f.ContainerID):
		return fmt.Errorf("hostIfName %q is not the one of container %q (%s)", f.HostIfName, f.ContainerID, HostIfName(f.ContainerID))
	case !f.IPv4.IsValid() && !f.IPv6.IsValid():
		return errors.New("no address")
	case f.IPv4.IsValid() && !f.IPv4.Is4(), f.IPv6.IsValid() && !f.IPv6.Is6():
		return fmt.Errorf("address of the wrong family: ipv4 %s, ipv6 %s", f.IPv4, f.IPv6)
	case f.IPv4.Zone() != "" || f.IPv6.Zone() != "":
		return fmt.Errorf("address with a zone: ipv4 %s, ipv6 %s", f.IPv4, f.IPv6)
	}
	if err := validContainerID(f.ContainerID); err != nil {
		return err
	}
	if err := validNetns(f.Netns); err != nil {
		return err
	}
	return validIfName(f.IfName)
}

// stateStore reads and writes the endpoints' state files.
type stateStore struct {
	log          *slog.Logger
	dir, invalid string
	// dirSync makes new endpoint directories durable: one sync of the
	// endpoints directory for the creations that run at once.
	dirSync *statefile.DirSyncer
	// fault, set by tests, fails the writes of the phases it returns an
	// error for.
	fault func(phase) error
	// moved are the entries quarantine moved aside since takeMoved.
	moved []movedFile
}

// takeMoved returns what was moved aside since the last call.
func (s *stateStore) takeMoved() []movedFile {
	out := s.moved
	s.moved = nil
	return out
}

func newStateStore(log *slog.Logger, stateDir string) *stateStore {
	dir := filepath.Join(stateDir, endpointsDir)
	return &stateStore{log: log, dir: dir, invalid: filepath.Join(stateDir, invalidDir), dirSync: statefile.NewDirSyncer(dir)}
}

func (s *stateStore) endpointDir(id uint16) string {
	return filepath.Join(s.dir, strconv.Itoa(int(id)))
}

// write persists ep, atomically: a crash leaves the previous version.
func (s *stateStore) write(ep *Endpoint, ph phase) error {
	data, err := s.marshal(ep, ph)
	if err != nil {
		return err
	}
	dir := s.endpointDir(ep.ID)
	if err := statefile.MkdirAll(dir); err != nil {
		return err
	}
	return statefile.Write(filepath.Join(dir, stateFileName), data)
}

// create persists a new endpoint in a directory of its own, made here.
// The file (written as write does) and the directory's entry are made
// durable at once: the entry by a sync of the endpoints directory that
// serves every creation running meanwhile (group commit), the file by
// syncs of its own.
//
// A directory already there was left by a creation that was not undone
// (its removal failed): its entry is synced all the same, as nothing says
// that creation's sync ever succeeded.
func (s *stateStore) create(ep *Endpoint, ph phase) error {
	data, err := s.marshal(ep, ph)
	if err != nil {
		return err
	}
	dir := s.endpointDir(ep.ID)
	if err := os.Mkdir(dir, 0o700); errors.Is(err, fs.ErrExist) {
		// Made sure of as write does.
		if err := statefile.MkdirAll(dir); err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("create endpoint state directory: %w", err)
	}
	entry := make(chan error, 1)
	go func() { entry <- s.dirSync.Sync() }()
	err = statefile.Write(filepath.Join(dir, stateFileName), data)
	if eerr := <-entry; err == nil && eerr != nil {
		err = fmt.Errorf("create endpoint state directory: %w", eerr)
	}
	return err
}

// marshal is ep's state file in phase ph, unless the test hook fault
// fails the write.
func (s *stateStore) marshal(ep *Endpoint, ph phase) ([]byte, error) {
	if s.fault != nil {
		if err := s.fault(ph); err != nil {
			return nil, err
		}
	}
	return json.MarshalIndent(toStateFile(ep, ph), "", "  ")
}

func (s *stateStore) remove(id uint16) error { return statefile.Remove(s.endpointDir(id)) }

// load reads every endpoint directory. Temporary files of interrupted
// writes are removed; a directory without a state file (the agent died
// between creating it and writing the file) is removed; a state file that
// cannot be read (also one that is not a regular file: a directory, a FIFO)
// or does not parse or validate is moved to the invalid directory with a
// log line naming the file and the error, and the restore goes on.
func (s *stateStore) load() ([]*stateFile, error) {
	if err := statefile.MkdirAll(s.dir); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("read endpoint state: %w", err)
	}
	var out []*stateFile
	for _, e := range entries {
		dir := filepath.Join(s.dir, e.Name())
		if !e.IsDir() {
			if err := s.quarantine(dir, errors.New("not an endpoint directory")); err != nil {
				return nil, err
			}
			continue
		}
		removed, err := statefile.RemoveTemps(dir)
		if err != nil {
			return nil, err
		}
		for _, path := range removed {
			s.log.Info("Removed temporary endpoint state file of an interrupted write", "file", path)
		}
		path := filepath.Join(dir, stateFileName)
		data, err := statefile.ReadRegular(path)
		if errors.Is(err, fs.ErrNotExist) {
			s.log.Info("Removed endpoint directory without a state file, left by an interrupted creation", "dir", dir)
			if err := statefile.Remove(dir); err != nil {
				return nil, err
			}
			continue
		}
		var f *stateFile
		if err == nil {
			f, err = parseStateFile(data, e.Name())
		}
		if err != nil {
			if err := s.quarantine(path, err); err != nil {
				return nil, err
			}
			continue
		}
		out = append(out, f)
	}
	return out, nil
}

func parseStateFile(data []byte, dirName string) (*stateFile, error) {
	var f stateFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, err
	}
	if err := f.validate(dirName); err != nil {
		return nil, err
	}
	return &f, nil
}

// quarantine moves the endpoint directory that holds path to the invalid
// directory, where it is kept for whoever investigates.
func (s *stateStore) quarantine(path string, why error) error {
	dir := path
	if filepath.Dir(path) != s.dir {
		dir = filepath.Dir(path)
	}
	to, err := statefile.MoveAside(dir, s.invalid)
	if err == nil {
		s.moved = append(s.moved, movedFile{path: path, to: to, why: why})
	}
	s.log.Error("Invalid endpoint state file, moved aside; the endpoint is not restored",
		"file", path, "error", why, "moved-to", to)
	return err
}
