package lbhealthcheck

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/loadbalancer"
)

// Cell serves the health check node port of every Service with
// externalTrafficPolicy: Local.
var Cell = cell.Module(
	"lb-healthcheck",
	"Health check node ports of Services with local traffic policy",

	cell.Config(defaultConfig),
	cell.ProvidePrivate(job.Registry.NewGroup),
	cell.Invoke(newHealthCheckServer),
)

// Config is the lb-healthcheck cell's configuration.
type Config struct {
	// EnableHealthCheckNodeport turns the health check node ports on.
	EnableHealthCheckNodeport bool
	// HealthCheckNodeportBindAddress is the address the listeners bind;
	// empty: every address of the node.
	HealthCheckNodeportBindAddress string
}

var defaultConfig = Config{EnableHealthCheckNodeport: true}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.Bool("enable-health-check-nodeport", def.EnableHealthCheckNodeport,
		"Serve spec.healthCheckNodePort of Services with externalTrafficPolicy Local, as kube-proxy does")
	flags.String("health-check-nodeport-bind-address", def.HealthCheckNodeportBindAddress,
		"IP address the health check node ports listen on; empty: every address of the node")
}

// bindAddress is the validated bind address; invalid if it is unset.
func (cfg Config) bindAddress() (netip.Addr, error) {
	if cfg.HealthCheckNodeportBindAddress == "" {
		return netip.Addr{}, nil
	}
	a, err := netip.ParseAddr(cfg.HealthCheckNodeportBindAddress)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("invalid --health-check-nodeport-bind-address %q: want an IP address such as 192.168.1.10 or fd00::10, or empty for every address",
			cfg.HealthCheckNodeportBindAddress)
	}
	return a.Unmap(), nil
}

type params struct {
	cell.In

	Config   Config
	Log      *slog.Logger
	DB       *statedb.DB
	Services statedb.Table[*loadbalancer.Service]
	Backends statedb.Table[*loadbalancer.SliceBackends]
	NodeName daemon.NodeName
	Jobs     job.Group
	Health   cell.Health
}

func newHealthCheckServer(p params) error {
	addr, err := p.Config.bindAddress()
	if err != nil {
		return err
	}
	if !p.Config.EnableHealthCheckNodeport {
		p.Health.OK("Disabled (--enable-health-check-nodeport=false)")
		return nil
	}
	s := newServer(p.Log, p.DB, p.Services, p.Backends, string(p.NodeName), addr)
	p.Jobs.Add(job.OneShot("serve", func(ctx context.Context, health cell.Health) error {
		return s.run(ctx, health)
	}))
	return nil
}
