package lbhealthcheck

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/internal/tables"
	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/pkg/netlimit"
)

// retryInterval is how often a port that could not be bound is tried again.
const retryInterval = 5 * time.Second

// server keeps one listener per Service that has a health check node port.
type server struct {
	log      *slog.Logger
	db       *statedb.DB
	services statedb.Table[*loadbalancer.Service]
	backends statedb.Table[*loadbalancer.SliceBackends]
	node     string
	// addr is the bind address; the zero Addr binds every address.
	addr netip.Addr

	// byName are the Services that should be served, bound or not. Only
	// run's goroutine touches it.
	byName map[loadbalancer.ServiceName]*listener
}

func newServer(log *slog.Logger, db *statedb.DB, services statedb.Table[*loadbalancer.Service],
	backends statedb.Table[*loadbalancer.SliceBackends], node string, addr netip.Addr) *server {
	return &server{log: log, db: db, services: services, backends: backends, node: node, addr: addr,
		byName: map[loadbalancer.ServiceName]*listener{}}
}

// listener is one Service's health check node port.
type listener struct {
	name loadbalancer.ServiceName
	port uint16
	// localEndpoints is what the handler answers; run updates it.
	localEndpoints atomic.Int64
	// srv serves while the port is bound; err is why it is not.
	srv *http.Server
	err error
}

// wants is whether svc gets a health check node port on this node: kube-proxy
// serves it for Services whose external traffic stays on the node it
// arrives at.
func wants(svc *loadbalancer.Service) bool {
	return svc.HealthCheckNodePort != 0 && svc.ExtTrafficPolicyLocal &&
		(svc.Type == loadbalancer.ServiceLoadBalancer || svc.Type == loadbalancer.ServiceNodePort)
}

// run follows the services and backends tables from their initialization
// on, opening, moving and closing listeners and updating their counts, until
// ctx ends; then it closes every listener.
func (s *server) run(ctx context.Context, health cell.Health) error {
	wtxn := s.db.WriteTxn(s.services, s.backends)
	svcChanges, err := s.services.Changes(wtxn)
	if err != nil {
		wtxn.Abort()
		return fmt.Errorf("watch table %s: %w", s.services.Name(), err)
	}
	beChanges, err := s.backends.Changes(wtxn)
	if err != nil {
		wtxn.Abort()
		svcChanges.Close()
		return fmt.Errorf("watch table %s: %w", s.backends.Name(), err)
	}
	wtxn.Commit()
	defer svcChanges.Close()
	defer beChanges.Close()
	defer s.closeAll()

	// Until both tables have their initial contents, a Service may look as
	// if it had no local endpoint: answering 503 then would take the node
	// out of the load balancer for nothing.
	health.OK("Waiting for the services and backends tables")
	if tables.WaitInitialized(ctx, s.db, s.services) != nil || tables.WaitInitialized(ctx, s.db, s.backends) != nil {
		return nil
	}

	var retry <-chan time.Time
	for {
		txn := s.db.ReadTxn()
		dirty := map[loadbalancer.ServiceName]struct{}{}
		svcSeq, svcWatch := svcChanges.Next(txn)
		for c := range svcSeq {
			// Only a Service that is served, or wants to be: the others
			// have nothing to open or close (at a start, 50,000 of
			// them, each a map entry and a look-up).
			if _, served := s.byName[c.Object.Name]; served || !c.Deleted && wants(c.Object) {
				dirty[c.Object.Name] = struct{}{}
			}
		}
		beSeq, beWatch := beChanges.Next(txn)
		for c := range beSeq {
			if _, ok := s.byName[c.Object.ServiceName]; ok {
				dirty[c.Object.ServiceName] = struct{}{}
			}
		}
		for name := range dirty {
			s.sync(txn, name)
		}
		if retry == nil {
			s.retryFailed()
		}
		failed := s.report(health)
		if failed && retry == nil {
			retry = time.After(retryInterval)
		}

		select {
		case <-ctx.Done():
			return nil
		case <-svcWatch:
		case <-beWatch:
		case <-retry:
			retry = nil
		}
	}
}

// sync brings the listener of the Service name to what the tables say.
func (s *server) sync(txn statedb.ReadTxn, name loadbalancer.ServiceName) {
	svc, _, found := s.services.Get(txn, loadbalancer.ServiceByName.Query(name))
	l := s.byName[name]
	if l != nil && (!found || !wants(svc) || svc.HealthCheckNodePort != l.port) {
		s.close(l)
		delete(s.byName, name)
		l = nil
	}
	if !found || !wants(svc) {
		return
	}
	if l == nil {
		l = &listener{name: name, port: svc.HealthCheckNodePort}
		s.byName[name] = l
		s.open(l)
	}
	l.localEndpoints.Store(int64(s.countLocal(txn, name)))
}

// countLocal is the number of distinct addresses of name's active,
// unquarantined backends on this node: a pod that serves two ports, or
// that two slices list, is one endpoint.
func (s *server) countLocal(txn statedb.ReadTxn, name loadbalancer.ServiceName) int {
	addrs := map[netip.Addr]struct{}{}
	for row := range loadbalancer.BackendsOf(txn, s.backends, name) {
		for _, be := range row.Backends {
			if be.EffectiveState() == loadbalancer.BackendActive && be.NodeName == s.node {
				addrs[be.Address.Addr] = struct{}{}
			}
		}
	}
	return len(addrs)
}

// open binds l's port and serves it, or records why it cannot.
func (s *server) open(l *listener) {
	ln, err := net.Listen("tcp", s.listenAddr(l.port))
	if err != nil {
		if l.err == nil {
			s.log.Warn("Cannot serve a health check node port", "service", l.name, "port", l.port, "error", err)
		}
		l.err = err
		return
	}
	l.err = nil
	// Load balancers outside the cluster probe it, so anyone who reaches
	// the node may: netlimit bounds what a client can hold.
	l.srv = &http.Server{Handler: l}
	netlimit.Default.Apply(l.srv)
	s.log.Info("Serving health check node port", "service", l.name, "addr", ln.Addr().String())
	go l.srv.Serve(netlimit.Default.Listener(ln))
}

func (s *server) listenAddr(port uint16) string {
	if !s.addr.IsValid() {
		return ":" + strconv.Itoa(int(port))
	}
	return netip.AddrPortFrom(s.addr, port).String()
}

// close stops serving l: the listener and every open connection.
func (s *server) close(l *listener) {
	if l.srv == nil {
		return
	}
	l.srv.Close()
	l.srv = nil
	s.log.Info("Stopped serving health check node port", "service", l.name, "port", l.port)
}

func (s *server) closeAll() {
	for _, l := range s.byName {
		s.close(l)
	}
}

// retryFailed tries again to bind the ports that could not be bound.
func (s *server) retryFailed() {
	for _, l := range s.byName {
		if l.err != nil {
			s.open(l)
		}
	}
}

// report sets the cell's health: the ports that cannot be served, by
// Service, or how many are. It returns whether any failed.
func (s *server) report(health cell.Health) bool {
	var errs []error
	serving := 0
	for _, name := range slices.SortedFunc(maps.Keys(s.byName), compareNames) {
		l := s.byName[name]
		if l.err != nil {
			errs = append(errs, fmt.Errorf("Service %s: health check node port %d: %w", l.name, l.port, l.err))
		} else {
			serving++
		}
	}
	if len(errs) > 0 {
		health.Degraded(fmt.Sprintf("Serving %d of %d health check node ports", serving, len(s.byName)), errors.Join(errs...))
		return true
	}
	health.OK(fmt.Sprintf("Serving %d health check node ports", serving))
	return false
}

func compareNames(a, b loadbalancer.ServiceName) int {
	return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
}

// response is the body kube-proxy's health check server answers with.
type response struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int64 `json:"localEndpoints"`
	ServiceProxyHealthy bool  `json:"serviceProxyHealthy"`
}

// ServeHTTP answers any request, as kube-proxy does: 200 with at least one
// local endpoint, 503 without.
func (l *listener) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	n := l.localEndpoints.Load()
	var body response
	body.Service.Namespace, body.Service.Name = l.name.Namespace, l.name.Name
	body.LocalEndpoints = n
	body.ServiceProxyHealthy = true
	b, _ := json.Marshal(body)

	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Load-Balancing-Endpoint-Weight", strconv.FormatInt(n, 10))
	if n > 0 {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	w.Write(b)
}
