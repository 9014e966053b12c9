package loader

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"

	"github.com/cellium/cellium/bpf"
	"github.com/cellium/cellium/cells/ctmaps"
	"github.com/cellium/cellium/cells/endpointmaps"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/cells/policymaps"
)

// lxcPrograms are the endpoint programs of bpf/lxc.c, loaded once per
// agent start with the agent's maps and the ct-maps cell's flags as
// constants. Attaching them is the endpoint reconciler's.
type lxcPrograms struct {
	log       *slog.Logger
	cfg       ctmaps.Config
	ct        *ctmaps.Maps
	events    *ctmaps.Events
	endpoints *endpointmaps.EndpointMap
	ipcache   *ipcache.Map
	policy    *policymaps.Maps
	loader    Config
	dsr       *nodePortMaps

	coll  *ebpf.Collection
	progs map[endpointHook]*ebpf.Program
	ids   map[endpointHook]ebpf.ProgramID
}

// lxcProgramNames are the programs by the hook they run at.
var lxcProgramNames = map[endpointHook]string{
	fromEndpoint: bpf.LXCProgCelliumFromEndpoint,
	toEndpoint:   bpf.LXCProgCelliumToEndpoint,
}

// newLXCPrograms takes the maps so that they open before the programs
// load, which needs them; the DSR map is among the NodePort maps.
func newLXCPrograms(lc cell.Lifecycle, log *slog.Logger, cfg ctmaps.Config, ct *ctmaps.Maps, events *ctmaps.Events,
	endpoints *endpointmaps.EndpointMap, ipc *ipcache.Map, policy *policymaps.Maps, loader Config, np *nodePortMaps) endpointPrograms {
	p := &lxcPrograms{log: log, cfg: cfg, ct: ct, events: events, endpoints: endpoints, ipcache: ipc, policy: policy, loader: loader, dsr: np}
	lc.Append(p)
	return p
}

var _ cell.HookDescriptiveInterface = (*lxcPrograms)(nil)

func (p *lxcPrograms) HookInfo() string { return "endpoint programs" }

func (p *lxcPrograms) Start(cell.HookContext) error {
	spec, replacements, err := p.spec()
	if err != nil {
		return err
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: replacements})
	if err != nil {
		if ve, ok := errors.AsType[*ebpf.VerifierError](err); ok {
			p.log.Error("The verifier refused an endpoint program", "log", fmt.Sprintf("%+v", ve))
		}
		return fmt.Errorf("load the endpoint programs: %w", err)
	}
	progs := map[endpointHook]*ebpf.Program{}
	ids := map[endpointHook]ebpf.ProgramID{}
	for h, name := range lxcProgramNames {
		prog := coll.Programs[name]
		if prog == nil {
			coll.Close()
			return fmt.Errorf("the endpoint programs have no program %s", name)
		}
		info, err := prog.Info()
		if err != nil {
			coll.Close()
			return fmt.Errorf("endpoint program %s: %w", name, err)
		}
		id, _ := info.ID()
		progs[h], ids[h] = prog, id
	}
	p.coll, p.progs, p.ids = coll, progs, ids
	p.log.Info("Loaded the endpoint programs", "constants", p.cfg.ProgramConstants())
	return nil
}

// spec is the compiled object fitted to the agent: constants from the
// flags, and the sizes of the agent's maps, which replace the object's
// own.
func (p *lxcPrograms) spec() (*ebpf.CollectionSpec, map[string]*ebpf.Map, error) {
	spec, err := bpf.LoadLXC()
	if err != nil {
		return nil, nil, err
	}
	for name, value := range p.cfg.ProgramConstants() {
		v := spec.Variables[name]
		if v == nil {
			return nil, nil, fmt.Errorf("the endpoint programs have no constant %s", name)
		}
		if err := v.Set(value); err != nil {
			return nil, nil, fmt.Errorf("set %s: %w", name, err)
		}
	}
	dsr := spec.Variables[bpf.LXCVarLbDsr]
	if dsr == nil {
		return nil, nil, fmt.Errorf("the endpoint programs have no constant %s", bpf.LXCVarLbDsr)
	}
	if err := dsr.Set(p.loader.lbModeConstant()); err != nil {
		return nil, nil, fmt.Errorf("set %s: %w", bpf.LXCVarLbDsr, err)
	}
	replacements := p.ct.EBPF()
	maps.Copy(replacements, p.events.EBPF())
	replacements[p.endpoints.Name()] = p.endpoints.EBPF()
	replacements[p.ipcache.Name()] = p.ipcache.EBPF()
	replacements[p.dsr.DSR.Name()] = p.dsr.DSR.EBPF()
	maps.Copy(replacements, p.policy.EBPF())
	for name, m := range replacements {
		ms, ok := spec.Maps[name]
		if !ok {
			return nil, nil, fmt.Errorf("the endpoint programs have no map %s", name)
		}
		ms.MaxEntries = m.MaxEntries()
	}
	return spec, replacements, nil
}

func (p *lxcPrograms) program(h endpointHook) (*ebpf.Program, ebpf.ProgramID) {
	return p.progs[h], p.ids[h]
}

// Stop closes the agent's handles: the pinned links keep the programs.
func (p *lxcPrograms) Stop(cell.HookContext) error {
	if p.coll != nil {
		p.coll.Close()
		p.coll = nil
	}
	return nil
}
