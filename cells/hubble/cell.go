package hubble

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/internal/chans"
	"github.com/cellium/cellium/cells/monitor"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/monitorapi"
	"github.com/cellium/cellium/pkg/netlimit"
)

// Cell turns the monitor's events into flows and serves them with the
// Hubble Observer API: see the package documentation.
var Cell = cell.Module(
	"hubble",
	"Flows from monitor events served with the Hubble Observer API",

	cell.Config(DefaultConfig),
	cell.ProvidePrivate(job.Registry.NewGroup),
	cell.Provide(newHubble),
	cell.Invoke(requireHubble),
)

// requireHubble pulls the server into the graph: nothing needs to depend
// on it for it to serve.
func requireHubble(*Hubble) {}

// Config is the hubble cell's configuration.
type Config struct {
	HubbleEnabled bool
	// HubbleBufferSize is the number of flows the ring keeps.
	HubbleBufferSize int
	// HubbleEventQueueSize is how many events the monitor may queue for
	// the cell before it loses them; 0 means HubbleBufferSize.
	HubbleEventQueueSize int
	// HubbleListenAddress is where the gRPC server listens: see
	// ListenAddress.
	HubbleListenAddress string
	// HubbleTCPListenAddress is a second address the server listens on,
	// host:port, for hubble-relay; "" for none.
	HubbleTCPListenAddress string
	// HubblePeerPort is the port the Peer service announces for every
	// node; 0: the port of this agent's TCP listener, else
	// DefaultPeerPort.
	HubblePeerPort int
	// HubbleTLSCertFile and HubbleTLSKeyFile are the TCP listeners'
	// certificate and key (PEM), read again when they change.
	HubbleTLSCertFile string
	HubbleTLSKeyFile  string
	// HubbleTLSClientCAFiles are the CAs (PEM) a client's certificate
	// must be signed by; none: clients need no certificate.
	HubbleTLSClientCAFiles []string
	// HubbleDisableTLS lets the TCP listeners serve plaintext.
	HubbleDisableTLS bool
}

// DefaultConfig is the hubble cell's default configuration. The client
// command `agent observe` takes --hubble-listen-address with the same
// default.
var DefaultConfig = Config{
	HubbleEnabled:        true,
	HubbleBufferSize:     4095,
	HubbleEventQueueSize: 0,
	HubbleListenAddress:  "",
	// Off by default: a TCP listener needs a certificate (or consent to
	// plaintext), so it is asked for.
	HubbleTCPListenAddress: "",
	HubblePeerPort:         0,
	HubbleTLSCertFile:      "",
	HubbleTLSKeyFile:       "",
	HubbleTLSClientCAFiles: []string{},
	HubbleDisableTLS:       false,
}

// maxBufferSize bounds --hubble-buffer-size: a flow takes about a
// kilobyte, so this is a gigabyte of flows; more is a typo.
const maxBufferSize = 1 << 20

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.Bool("hubble-enabled", def.HubbleEnabled, "Serve flows with the Hubble Observer API (gRPC)")
	flags.Int("hubble-buffer-size", def.HubbleBufferSize,
		fmt.Sprintf("Flows the Hubble ring keeps for GetFlows (exactly this many, 1 to %d)", maxBufferSize))
	flags.Int("hubble-event-queue-size", def.HubbleEventQueueSize,
		"Monitor events queued for conversion to flows before Hubble loses them (0: --hubble-buffer-size)")
	flags.String("hubble-listen-address", def.HubbleListenAddress,
		"Where the Hubble server listens: empty for hubble.sock in --run-dir, unix:///path/to.sock, or host:port such as :4244 (TCP with TLS, see --hubble-tls-cert-file)")
	flags.String("hubble-tcp-listen-address", def.HubbleTCPListenAddress,
		"A second address the Hubble server listens on, host:port such as :4244 (TCP with TLS, see --hubble-tls-cert-file), where hubble-relay reaches it; empty: none")
	flags.String("hubble-tls-cert-file", def.HubbleTLSCertFile,
		"The Hubble TCP listeners' TLS certificate (PEM), read again when it changes; its DNS names must include <node>.default.hubble-grpc.cilium.io and hubble-peer.default.hubble-grpc.cilium.io for hubble-relay (or *.default.hubble-grpc.cilium.io)")
	flags.String("hubble-tls-key-file", def.HubbleTLSKeyFile,
		"The private key (PEM) of --hubble-tls-cert-file, read again when it changes")
	flags.StringSlice("hubble-tls-client-ca-files", def.HubbleTLSClientCAFiles,
		"CA certificates (PEM) that must have signed a Hubble TCP client's certificate (mutual TLS); empty: clients need no certificate")
	flags.Bool("hubble-disable-tls", def.HubbleDisableTLS,
		"Serve the Hubble TCP listeners without TLS: anyone who reaches them reads every flow of the node")
	flags.Int("hubble-peer-port", def.HubblePeerPort,
		fmt.Sprintf("The port the Hubble Peer service announces for every node (<node-ip>:<port>); 0: the port of this agent's TCP listener (--hubble-tcp-listen-address, else a TCP --hubble-listen-address), or %d without one", DefaultPeerPort))
}

func (cfg Config) validate() error {
	if cfg.HubbleBufferSize < 1 || cfg.HubbleBufferSize > maxBufferSize {
		return fmt.Errorf("invalid --hubble-buffer-size %d: want 1 to %d flows", cfg.HubbleBufferSize, maxBufferSize)
	}
	if cfg.HubbleEventQueueSize < 0 || cfg.HubbleEventQueueSize > maxBufferSize {
		return fmt.Errorf("invalid --hubble-event-queue-size %d: want 1 to %d events, or 0 for --hubble-buffer-size", cfg.HubbleEventQueueSize, maxBufferSize)
	}
	if cfg.HubblePeerPort < 0 || cfg.HubblePeerPort > 65535 {
		return fmt.Errorf("invalid --hubble-peer-port %d: want a port number 1 to 65535, or 0 for the port of the TCP listener", cfg.HubblePeerPort)
	}
	return cfg.validateTLS()
}

// validateTLS checks the TLS flags against each other and the listen
// addresses: a TCP listener gets TLS, or plaintext only when asked for.
func (cfg Config) validateTLS() error {
	switch {
	case (cfg.HubbleTLSCertFile == "") != (cfg.HubbleTLSKeyFile == ""):
		return fmt.Errorf("--hubble-tls-cert-file %q and --hubble-tls-key-file %q: set both or neither", cfg.HubbleTLSCertFile, cfg.HubbleTLSKeyFile)
	case cfg.HubbleDisableTLS && cfg.HubbleTLSCertFile != "":
		return fmt.Errorf("--hubble-disable-tls with --hubble-tls-cert-file %q: choose one", cfg.HubbleTLSCertFile)
	case len(cfg.HubbleTLSClientCAFiles) > 0 && cfg.HubbleTLSCertFile == "":
		return fmt.Errorf("--hubble-tls-client-ca-files %v without --hubble-tls-cert-file: mutual TLS needs the server's certificate too", cfg.HubbleTLSClientCAFiles)
	case cfg.HubbleTLSCertFile != "" || cfg.HubbleDisableTLS || !cfg.HubbleEnabled:
		return nil
	}
	for _, f := range []struct{ flag, value string }{
		{"--hubble-listen-address", cfg.HubbleListenAddress},
		{"--hubble-tcp-listen-address", cfg.HubbleTCPListenAddress},
	} {
		if a, err := ListenAddress(f.value, "/"); err == nil && a.Network == "tcp" {
			return fmt.Errorf("%s %s is TCP, which Hubble serves only with TLS: %w", f.flag, f.value, errTLSFlags)
		}
	}
	return nil
}

// tcpListenAddress is --hubble-tcp-listen-address, checked: nil for none.
func (cfg Config) tcpListenAddress() (*Address, error) {
	if cfg.HubbleTCPListenAddress == "" {
		return nil, nil
	}
	// ListenAddress checks host and port as it does for
	// --hubble-listen-address; a unix socket is no TCP address.
	a, err := ListenAddress(cfg.HubbleTCPListenAddress, "/")
	if err != nil || a.Network != "tcp" {
		return nil, fmt.Errorf("invalid --hubble-tcp-listen-address %q: want host:port, the host an IP address, localhost or empty, such as :4244 or 10.0.0.1:4244", cfg.HubbleTCPListenAddress)
	}
	return &a, nil
}

// Hubble is the hubble cell: the observer and its gRPC server.
type Hubble struct {
	cfg      Config
	log      *slog.Logger
	health   cell.Health
	addr     Address
	tcpAddr  *Address
	monitor  *monitor.Monitor
	db       *statedb.DB
	convert  *converter
	observer *Observer
	server   *grpcServer
	peer     *peerServer
	// tls serves the TCP listeners' TLS; nil for plaintext, or without a
	// TCP listener.
	tls *tlsFiles

	// sub and lostAtStart are taken in the start hook, before the job
	// that reads them runs: what is published or lost from the end of
	// the start on is this cell's.
	sub         *monitor.Subscription
	lostAtStart uint64
}

type params struct {
	cell.In

	Config    Config
	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Jobs      job.Group
	Health    cell.Health
	Paths     daemon.Paths
	Node      daemon.NodeName
	Monitor   *monitor.Monitor
	DB        *statedb.DB
	Tables    Tables
	Nodes     statedb.Table[*nodes.Node]
}

func newHubble(p params) (*Hubble, error) {
	if err := p.Config.validate(); err != nil {
		return nil, err
	}
	addr, err := ListenAddress(p.Config.HubbleListenAddress, p.Paths.RunDir)
	if err != nil {
		return nil, err
	}
	tcpAddr, err := p.Config.tcpListenAddress()
	if err != nil {
		return nil, err
	}
	h := &Hubble{cfg: p.Config, log: p.Log, health: p.Health, addr: addr, tcpAddr: tcpAddr}
	if !p.Config.HubbleEnabled {
		p.Lifecycle.Append(cell.Hook{OnStart: func(cell.HookContext) error {
			h.health.OK("Disabled (--hubble-enabled=false)")
			return nil
		}})
		return h, nil
	}
	h.monitor, h.db = p.Monitor, p.DB
	h.convert = newConverter(string(p.Node), p.Tables)
	h.observer = NewObserver(p.Config.HubbleBufferSize, string(p.Node), time.Now)
	h.peer = newPeerServer(p.DB, p.Nodes)
	// The Peer service announces TLS when this agent has a certificate,
	// even with no TCP listener of its own: every node is configured
	// alike.
	h.peer.tls = p.Config.HubbleTLSCertFile != ""
	var tlsConfig *tls.Config
	if p.Config.HubbleTLSCertFile != "" && (addr.Network == "tcp" || tcpAddr != nil) {
		h.tls = newTLSFiles(p.Config, p.Log, p.Health.NewScope("tls"))
		tlsConfig = h.tls.serverConfig()
	}
	h.server = newGRPCServer(h.observer, h.peer, tlsConfig, netlimit.Default)
	// This constructor takes daemon.Paths and the Monitor: the run
	// directory exists and the monitor reads by the time these run. The
	// jobs are added after the hook, so they start after it.
	p.Lifecycle.Append(cell.Hook{OnStart: h.start, OnStop: h.stop})
	p.Jobs.Add(job.OneShot("observe-events", h.observeEvents))
	if h.tls != nil {
		p.Jobs.Add(job.Timer("tls-reload", func(context.Context) error {
			h.tls.reload()
			return nil
		}, certReloadInterval))
	}
	return h, nil
}

// Address is where the server listens (or would, when disabled).
func (h *Hubble) Address() Address { return h.addr }

// TCPAddress is the second, TCP, address the server listens on
// (--hubble-tcp-listen-address), if any; with port 0 the port is the one
// it got once started.
func (h *Hubble) TCPAddress() (Address, bool) {
	if h.tcpAddr == nil {
		return Address{}, false
	}
	return *h.tcpAddr, true
}

// PeerPort is the port the Peer service announces for every node, once
// started.
func (h *Hubble) PeerPort() int {
	if h.peer == nil {
		return 0
	}
	return int(h.peer.port.Load())
}

func (h *Hubble) start(cell.HookContext) error {
	var (
		ln  net.Listener
		err error
	)
	if h.addr.Network == "unix" {
		ln, err = api.ListenUnix("hubble-listen-address", h.addr.Addr)
	} else {
		ln, err = net.Listen("tcp", h.addr.Addr)
		if err != nil {
			err = fmt.Errorf("--hubble-listen-address %s: %w", h.addr.Addr, err)
		}
	}
	if err != nil {
		return err
	}
	var plain, tcp []net.Listener
	tcpLn := ln
	if h.addr.Network == "unix" {
		plain, tcpLn = append(plain, ln), nil
	} else {
		ln = netlimit.Default.Listener(ln)
		tcp = append(tcp, ln)
	}
	if h.tcpAddr != nil {
		tcpLn, err = net.Listen("tcp", h.tcpAddr.Addr)
		if err != nil {
			ln.Close()
			return fmt.Errorf("--hubble-tcp-listen-address %s: %w", h.tcpAddr.Addr, err)
		}
		// A port 0 becomes the port the listener got, so that the
		// address is one a client can dial.
		h.tcpAddr.Addr = tcpLn.Addr().String()
		tcpLn = netlimit.Default.Listener(tcpLn)
		tcp = append(tcp, tcpLn)
	}
	var secure []net.Listener
	switch {
	case h.tls != nil:
		// Read the files now, so that the log and health say at start
		// whether clients can connect.
		h.tls.reload()
		secure = tcp
	case len(tcp) > 0:
		for _, l := range tcp {
			h.log.Warn("Serving Hubble on TCP without TLS (--hubble-disable-tls): anyone who reaches this address reads every flow of the node", "addr", l.Addr().String())
		}
		plain = append(plain, tcp...)
	}
	port := h.cfg.HubblePeerPort
	switch {
	case port != 0:
	case tcpLn != nil:
		port = tcpLn.Addr().(*net.TCPAddr).Port
	default:
		port = DefaultPeerPort
	}
	h.peer.port.Store(uint32(port))

	served := h.addr.String()
	if h.tcpAddr != nil {
		served += " and " + h.tcpAddr.String()
	}
	switch {
	case len(secure) > 0:
		served += " (TCP with TLS)"
	case len(tcp) > 0:
		served += " (TCP without TLS)"
	}
	h.log.Info("Serving Hubble", "addr", served, "peer-port", port, "buffer", h.cfg.HubbleBufferSize)
	h.server.serve(plain, secure, func(ln net.Listener, err error) {
		h.log.Error("Hubble server failed", "addr", ln.Addr().String(), "error", err)
		h.health.Degraded("Hubble server failed on "+ln.Addr().String(), err)
	})
	h.health.OK("Serving on " + served)

	queue := h.cfg.HubbleEventQueueSize
	if queue == 0 {
		queue = h.cfg.HubbleBufferSize
	}
	h.sub = h.monitor.Subscribe("hubble", queue)
	// Only what the datapath loses from now on is news to Hubble's
	// clients: the counter lives as long as the pinned ring buffer.
	h.lostAtStart = h.monitor.Lost()
	return nil
}

func (h *Hubble) stop(ctx cell.HookContext) error {
	h.sub.Close()
	// Closing the listener unlinks a unix socket.
	h.server.stop(ctx)
	h.health.Stopped("Stopped")
	return nil
}

// Batching and loss checks of the event loop.
const (
	// maxBatch is how many queued events share one snapshot of the
	// tables.
	maxBatch = 256
	// lostCheck is how often the loop reads the datapath's lost counter,
	// a BPF map lookup.
	lostCheck = time.Second
)

// observeEvents turns the monitor's events into flows until the agent
// stops, and records the events lost on the way: those the datapath could
// not write into its ring buffer, and those this subscriber fell too far
// behind to receive.
func (h *Hubble) observeEvents(ctx context.Context, health cell.Health) error {
	sub := h.sub
	datapathLost, queueLost := h.lostAtStart, uint64(0)
	health.OK("Observing monitor events")

	ticker := time.NewTicker(lostCheck)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			if n := h.monitor.Lost(); n > datapathLost {
				h.observer.AddLost(flow.LostEventSource_PERF_EVENT_RING_BUFFER, n-datapathLost)
				datapathLost = n
			}
		case ev, ok := <-sub.Events():
			if !ok {
				// The monitor stopped.
				return nil
			}
			txn := h.db.ReadTxn()
			h.handle(txn, ev)
			if chans.Ready(sub.Events(), maxBatch-1, func(ev monitorapi.Event) { h.handle(txn, ev) }) {
				return nil
			}
			if n := sub.Lost(); n > queueLost {
				h.observer.AddLost(flow.LostEventSource_OBSERVER_EVENTS_QUEUE, n-queueLost)
				queueLost = n
			}
		}
	}
}

// handle adds ev to the observer: a flow, or an agent event.
func (h *Hubble) handle(txn statedb.ReadTxn, ev monitorapi.Event) {
	if ae, ok := ev.(*monitorapi.AgentEvent); ok {
		h.observer.AddAgentEvent(agentEventOf(ae), ae.Time)
		return
	}
	if f := h.convert.flowOf(txn, ev); f != nil {
		h.observer.AddFlow(f)
	}
}
