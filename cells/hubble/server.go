package hubble

import (
	"context"
	"crypto/tls"
	"net"
	"sync"

	"github.com/cilium/cilium/api/v1/observer"
	peerpb "github.com/cilium/cilium/api/v1/peer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/cellium/cellium/pkg/netlimit"
)

// The health service reports on the Observer under two names: its gRPC
// service name, and the name `hubble status` asks for (Cilium's Hubble
// reports under that one).
var (
	ObserverService = observer.Observer_ServiceDesc.ServiceName
	HubbleService   = "hubble.server.Observer"
)

// grpcServer serves an Observer, the Peer service and the standard gRPC
// health service, on one or more listeners: plaintext, and with TLS.
type grpcServer struct {
	observer *Observer
	peer     *peerServer
	srv      *grpc.Server
	// tlsSrv serves the same services with TLS; nil without a TLS
	// configuration.
	tlsSrv *grpc.Server
	health *grpchealth.Server
}

// newGRPCServer serves o and peer; with tlsConfig, also on listeners
// given to serve as TLS listeners. limits bound what a client can hold:
// a connection must finish its handshake (TLS and the HTTP/2 preface)
// within ReadHeaderTimeout, one with no call in flight is closed after
// IdleTimeout (a follow stream is a call in flight: it is never cut), and
// a call's header is capped at MaxHeaderBytes. The caller caps the
// connections of each TCP listener with limits.Listener.
func newGRPCServer(o *Observer, peer *peerServer, tlsConfig *tls.Config, limits netlimit.Limits) *grpcServer {
	opts := []grpc.ServerOption{
		grpc.ConnectionTimeout(limits.ReadHeaderTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: limits.IdleTimeout}),
		grpc.MaxHeaderListSize(uint32(limits.MaxHeaderBytes)),
	}
	s := &grpcServer{observer: o, peer: peer, srv: grpc.NewServer(opts...), health: grpchealth.NewServer()}
	if tlsConfig != nil {
		s.tlsSrv = grpc.NewServer(append(opts, grpc.Creds(credentials.NewTLS(tlsConfig)))...)
	}
	for _, srv := range s.servers() {
		observer.RegisterObserverServer(srv, o)
		peerpb.RegisterPeerServer(srv, peer)
		healthpb.RegisterHealthServer(srv, s.health)
	}
	return s
}

func (s *grpcServer) servers() []*grpc.Server {
	if s.tlsSrv == nil {
		return []*grpc.Server{s.srv}
	}
	return []*grpc.Server{s.srv, s.tlsSrv}
}

// serve serves on each of plain, and with TLS on each of secure, in the
// background until stop; failed is called with the listener whose
// serving fails.
func (s *grpcServer) serve(plain, secure []net.Listener, failed func(net.Listener, error)) {
	s.health.SetServingStatus(ObserverService, healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(HubbleService, healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(PeerService, healthpb.HealthCheckResponse_SERVING)
	for _, ln := range plain {
		go func() {
			if err := s.srv.Serve(ln); err != nil {
				failed(ln, err)
			}
		}()
	}
	for _, ln := range secure {
		go func() {
			if err := s.tlsSrv.Serve(ln); err != nil {
				failed(ln, err)
			}
		}()
	}
}

// stop reports NOT_SERVING, ends the follow streams and waits for the
// other calls in flight until ctx ends. It closes the listener, which
// removes a unix socket.
func (s *grpcServer) stop(ctx context.Context) {
	s.health.Shutdown()
	s.observer.stop()
	s.peer.stop()
	var wg sync.WaitGroup
	for _, srv := range s.servers() {
		wg.Go(srv.GracefulStop)
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		for _, srv := range s.servers() {
			srv.Stop()
		}
		<-done
	}
}
