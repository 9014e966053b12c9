package lbmaps

import (
	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/bpf"
	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/pkg/lbmap"
)

// Maps are the load-balancing maps. See bpf/include/lb.h for what each
// holds and docs/datapath.md for how the programs use them.
type Maps struct {
	Services4   *bpfmaps.Map[lbmap.Service4Key, lbmap.ServiceValue]
	Services6   *bpfmaps.Map[lbmap.Service6Key, lbmap.ServiceValue]
	Backends4   *bpfmaps.Map[lbmap.BackendID, lbmap.Backend4]
	Backends6   *bpfmaps.Map[lbmap.BackendID, lbmap.Backend6]
	RevNAT4     *bpfmaps.Map[lbmap.RevNATIndex, lbmap.RevNAT4]
	RevNAT6     *bpfmaps.Map[lbmap.RevNATIndex, lbmap.RevNAT6]
	Maglev4     *MaglevMap
	Maglev6     *MaglevMap
	SockRevNAT4 *bpfmaps.Map[lbmap.SockRevNAT4Key, lbmap.SockRevNAT4Value]
	SockRevNAT6 *bpfmaps.Map[lbmap.SockRevNAT6Key, lbmap.SockRevNAT6Value]
	// Affinity serves both families: reverse NAT indexes are one space.
	Affinity *bpfmaps.Map[lbmap.AffinityKey, lbmap.AffinityValue]
}

func newMaps(cfg Config, lc cell.Lifecycle, reg *bpfmaps.Registry) (*Maps, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var (
		m   Maps
		err error
	)
	// See bpf/include/lb.h for the flags.
	hash := func(name string, max uint32) bpfmaps.Spec {
		return bpfmaps.Spec{Name: name, Type: ebpf.Hash, MaxEntries: max, Flags: unix.BPF_F_NO_PREALLOC}
	}
	lru := func(name string, max uint32) bpfmaps.Spec {
		return bpfmaps.Spec{Name: name, Type: ebpf.LRUHash, MaxEntries: max}
	}
	if m.Services4, err = bpfmaps.NewMap[lbmap.Service4Key, lbmap.ServiceValue](lc, reg, hash(bpf.SockLBMapCelliumLb4Services, cfg.LBServiceMapMax)); err != nil {
		return nil, err
	}
	if m.Services6, err = bpfmaps.NewMap[lbmap.Service6Key, lbmap.ServiceValue](lc, reg, hash(bpf.SockLBMapCelliumLb6Services, cfg.LBServiceMapMax)); err != nil {
		return nil, err
	}
	if m.Backends4, err = bpfmaps.NewMap[lbmap.BackendID, lbmap.Backend4](lc, reg, hash(bpf.SockLBMapCelliumLb4Backends, cfg.LBBackendMapMax)); err != nil {
		return nil, err
	}
	if m.Backends6, err = bpfmaps.NewMap[lbmap.BackendID, lbmap.Backend6](lc, reg, hash(bpf.SockLBMapCelliumLb6Backends, cfg.LBBackendMapMax)); err != nil {
		return nil, err
	}
	if m.RevNAT4, err = bpfmaps.NewMap[lbmap.RevNATIndex, lbmap.RevNAT4](lc, reg, hash(bpf.SockLBMapCelliumLb4Revnat, cfg.LBRevnatMapMax)); err != nil {
		return nil, err
	}
	if m.RevNAT6, err = bpfmaps.NewMap[lbmap.RevNATIndex, lbmap.RevNAT6](lc, reg, hash(bpf.SockLBMapCelliumLb6Revnat, cfg.LBRevnatMapMax)); err != nil {
		return nil, err
	}
	if m.Maglev4, err = newMaglevMap(lc, reg, bpf.SockLBMapCelliumLb4Maglev, cfg.LBRevnatMapMax, cfg.LBMaglevTableSize); err != nil {
		return nil, err
	}
	if m.Maglev6, err = newMaglevMap(lc, reg, bpf.SockLBMapCelliumLb6Maglev, cfg.LBRevnatMapMax, cfg.LBMaglevTableSize); err != nil {
		return nil, err
	}
	if m.SockRevNAT4, err = bpfmaps.NewMap[lbmap.SockRevNAT4Key, lbmap.SockRevNAT4Value](lc, reg, lru(bpf.SockLBMapCelliumLb4SockRevnat, cfg.LBSockRevnatMapMax)); err != nil {
		return nil, err
	}
	if m.SockRevNAT6, err = bpfmaps.NewMap[lbmap.SockRevNAT6Key, lbmap.SockRevNAT6Value](lc, reg, lru(bpf.SockLBMapCelliumLb6SockRevnat, cfg.LBSockRevnatMapMax)); err != nil {
		return nil, err
	}
	if m.Affinity, err = bpfmaps.NewMap[lbmap.AffinityKey, lbmap.AffinityValue](lc, reg, lru(bpf.SockLBMapCelliumLbAffinity, cfg.LBAffinityMapMax)); err != nil {
		return nil, err
	}
	return &m, nil
}

// EBPF is every open map by its name in bpf/sock_lb.c, for
// ebpf.CollectionOptions.MapReplacements. Call it from a start hook of a
// cell that takes *Maps: the maps are open by then.
func (m *Maps) EBPF() map[string]*ebpf.Map {
	return map[string]*ebpf.Map{
		m.Services4.Name():   m.Services4.EBPF(),
		m.Services6.Name():   m.Services6.EBPF(),
		m.Backends4.Name():   m.Backends4.EBPF(),
		m.Backends6.Name():   m.Backends6.EBPF(),
		m.RevNAT4.Name():     m.RevNAT4.EBPF(),
		m.RevNAT6.Name():     m.RevNAT6.EBPF(),
		m.Maglev4.Name():     m.Maglev4.EBPF(),
		m.Maglev6.Name():     m.Maglev6.EBPF(),
		m.SockRevNAT4.Name(): m.SockRevNAT4.EBPF(),
		m.SockRevNAT6.Name(): m.SockRevNAT6.EBPF(),
		m.Affinity.Name():    m.Affinity.EBPF(),
	}
}
