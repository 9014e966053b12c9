package monitor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"
	"golang.org/x/time/rate"

	"github.com/cellium/cellium/cells/ctmaps"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/cells/metrics"
	"github.com/cellium/cellium/cells/monitor/internal/fanout"
	"github.com/cellium/cellium/pkg/monitorapi"
)

// Cell provides the Monitor: datapath events and agent notifications,
// fanned out to subscribers, and GET /v1/monitor.
var Cell = cell.Module(
	"monitor",
	"Datapath events and agent notifications fanned out to subscribers",

	cell.Config(defaultConfig),
	cell.ProvidePrivate(job.Registry.NewGroup),
	cell.Provide(newMonitor, apiRoutes),
)

// Config is the monitor cell's configuration.
type Config struct {
	// MonitorAPIBuffer is the buffer of each GET /v1/monitor stream.
	MonitorAPIBuffer int
}

var defaultConfig = Config{MonitorAPIBuffer: 4096}

// maxAPIBuffer bounds --monitor-api-buffer: each stream holds its buffer.
const maxAPIBuffer = 1 << 20

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.Int("monitor-api-buffer", def.MonitorAPIBuffer,
		"Events each GET /v1/monitor stream (agent monitor) may fall behind by before it loses events")
}

func (cfg Config) validate() error {
	if cfg.MonitorAPIBuffer < 1 || cfg.MonitorAPIBuffer > maxAPIBuffer {
		return fmt.Errorf("invalid --monitor-api-buffer %d: want 1 to %d events", cfg.MonitorAPIBuffer, maxAPIBuffer)
	}
	return nil
}

// Subscription receives the monitor's events; see [Monitor.Subscribe].
// Events() delivers them, Lost() says how many it lost because its buffer
// was full, Close() ends it.
type Subscription = fanout.Subscription[monitorapi.Event]

// Monitor reads the datapath's events and fans them out, with the agent's
// notifications, to its subscribers. See the package documentation.
type Monitor struct {
	cfg     Config
	log     *slog.Logger
	events  *ctmaps.Events
	hub     *fanout.Hub[monitorapi.Event]
	metrics *monitorMetrics
	// invalidLog keeps a datapath that writes records this agent cannot
	// decode from flooding the log.
	invalidLog *rate.Limiter
}

type params struct {
	cell.In

	Config    Config
	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Jobs      job.Group
	Events    *ctmaps.Events
	DB        *statedb.DB
	Endpoints statedb.Table[*endpointmanager.Endpoint]
	Services  statedb.Table[*loadbalancer.Service]
	Frontends statedb.Table[*loadbalancer.Frontend]
	Readiness *health.Readiness
}

func newMonitor(p params) (*Monitor, metrics.Collectors, error) {
	if err := p.Config.validate(); err != nil {
		return nil, metrics.Collectors{}, err
	}
	m := &Monitor{
		cfg:        p.Config,
		log:        p.Log,
		events:     p.Events,
		hub:        fanout.NewHub[monitorapi.Event](),
		invalidLog: rate.NewLimiter(rate.Every(time.Minute), 1),
	}
	m.metrics = newMetrics(m)

	// Appended before the jobs, so that it stops after them: subscribers
	// see their channels closed once nothing more can come.
	p.Lifecycle.Append(cell.Hook{OnStop: m.closeSubscriptions})
	n := &notifier{
		publish:   m.publish,
		db:        p.DB,
		endpoints: p.Endpoints,
		services:  p.Services,
		frontends: p.Frontends,
		readiness: p.Readiness,
	}
	// This constructor takes *ctmaps.Events, whose start hooks open the
	// maps: jobs added here start after them.
	p.Jobs.Add(
		job.OneShot("read-events", m.readEvents,
			job.WithRetry(-1, &job.ExponentialBackoff{Min: 100 * time.Millisecond, Max: 30 * time.Second})),
		job.OneShot("notify-agent-started", n.agentStarted),
		job.OneShot("notify-endpoints", n.watchEndpoints),
		job.OneShot("notify-services", n.watchFrontends),
	)
	return m, metrics.NewCollectors(m.metrics.collectors()...), nil
}

// closeSubscriptions ends every subscription after what it holds.
func (m *Monitor) closeSubscriptions(cell.HookContext) error {
	m.hub.Close()
	return nil
}

// Subscribe adds a subscriber that receives every event from now on, with
// room for buffer events that it has not read yet; beyond that it loses
// events, which Lost counts, and the monitor never waits for it. name
// labels its losses in the metrics: use a name per kind of subscriber
// ("hubble", "api"), not one per subscription. Close the subscription when
// done; the monitor closes every subscription when it stops.
func (m *Monitor) Subscribe(name string, buffer int) *Subscription {
	return m.hub.Subscribe(name, buffer, m.metrics.subscriberLost(name))
}

// Lost is how many events the datapath could not write into the ring
// buffer because it was full, since the ring buffer was created; 0 while
// the counter cannot be read (before the agent started).
func (m *Monitor) Lost() (datapath uint64) {
	n, err := m.events.LostEvents()
	if err != nil {
		return 0
	}
	return n
}

// publish hands an event to every subscriber.
func (m *Monitor) publish(ev monitorapi.Event) {
	m.metrics.received(ev.Kind())
	m.hub.Publish(ev)
}

// bootClockRefresh is how often the reader reads the boot instant again,
// so that event times follow steps of the wall clock (NTP).
const bootClockRefresh = time.Minute

// readEvents reads the ring buffer until the agent stops.
func (m *Monitor) readEvents(ctx context.Context, health cell.Health) error {
	rd, err := ringbuf.NewReader(m.events.Ring.EBPF())
	if err != nil {
		return fmt.Errorf("read ring buffer %s: %w", m.events.Ring.Name(), err)
	}
	defer rd.Close()
	// Closing the reader is what interrupts a Read waiting for records.
	stop := context.AfterFunc(ctx, func() { rd.Close() })
	defer stop()
	health.OK("Reading " + m.events.Ring.Name())

	boot, bootRead := monitorapi.SystemBootClock(), time.Now()
	var rec ringbuf.Record
	for {
		if err := rd.ReadInto(&rec); err != nil {
			if ctx.Err() != nil || errors.Is(err, os.ErrClosed) {
				return nil
			}
			return fmt.Errorf("read ring buffer %s: %w", m.events.Ring.Name(), err)
		}
		if now := time.Now(); now.Sub(bootRead) > bootClockRefresh {
			boot, bootRead = monitorapi.SystemBootClock(), now
		}
		ev, err := monitorapi.Decode(rec.RawSample, boot)
		if err != nil {
			m.metrics.received(kindInvalid)
			if m.invalidLog.Allow() {
				m.log.Warn("Datapath event that this agent cannot decode (the programs and the agent may be of different versions); counted in cellium_monitor_events_total{type=\"invalid\"}",
					"error", err, "record", fmt.Sprintf("% x", rec.RawSample))
			}
			continue
		}
		m.publish(ev)
	}
}
