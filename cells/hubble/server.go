package hubble

import (
	"context"
	"net"

	"github.com/cilium/cilium/api/v1/observer"
	peerpb "github.com/cilium/cilium/api/v1/peer"
	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The health service reports on the Observer under two names: its gRPC
// service name, and the name `hubble status` asks for (Cilium's Hubble
// reports under that one).
var (
	ObserverService = observer.Observer_ServiceDesc.ServiceName
	HubbleService   = "hubble.server.Observer"
)

// grpcServer serves an Observer, the Peer service and the standard gRPC
// health service, on one or more listeners.
type grpcServer struct {
	observer *Observer
	peer     *peerServer
	srv      *grpc.Server
	health   *grpchealth.Server
}

func newGRPCServer(o *Observer, peer *peerServer) *grpcServer {
	s := &grpcServer{observer: o, peer: peer, srv: grpc.NewServer(), health: grpchealth.NewServer()}
	observer.RegisterObserverServer(s.srv, o)
	peerpb.RegisterPeerServer(s.srv, peer)
	healthpb.RegisterHealthServer(s.srv, s.health)
	return s
}

// serve serves on each of lns in the background until stop; failed is
// called with the listener whose serving fails.
func (s *grpcServer) serve(lns []net.Listener, failed func(net.Listener, error)) {
	s.health.SetServingStatus(ObserverService, healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(HubbleService, healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(PeerService, healthpb.HealthCheckResponse_SERVING)
	for _, ln := range lns {
		go func() {
			if err := s.srv.Serve(ln); err != nil {
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
	done := make(chan struct{})
	go func() {
		s.srv.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		s.srv.Stop()
		<-done
	}
}
