package hubble

import (
	"context"
	"net"

	"github.com/cilium/cilium/api/v1/observer"
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

// grpcServer serves an Observer and the standard gRPC health service.
type grpcServer struct {
	observer *Observer
	srv      *grpc.Server
	health   *grpchealth.Server
}

func newGRPCServer(o *Observer) *grpcServer {
	s := &grpcServer{observer: o, srv: grpc.NewServer(), health: grpchealth.NewServer()}
	observer.RegisterObserverServer(s.srv, o)
	healthpb.RegisterHealthServer(s.srv, s.health)
	return s
}

// serve serves on ln in the background until stop; failed is called if
// serving fails.
func (s *grpcServer) serve(ln net.Listener, failed func(error)) {
	s.health.SetServingStatus(ObserverService, healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(HubbleService, healthpb.HealthCheckResponse_SERVING)
	go func() {
		if err := s.srv.Serve(ln); err != nil {
			failed(err)
		}
	}()
}

// stop reports NOT_SERVING, ends the follow streams and waits for the
// other calls in flight until ctx ends. It closes the listener, which
// removes a unix socket.
func (s *grpcServer) stop(ctx context.Context) {
	s.health.Shutdown()
	s.observer.stop()
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
