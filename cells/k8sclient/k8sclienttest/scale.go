package k8sclienttest

import (
	"fmt"
	"io"
)

// WriteScaleManifests writes the manifests of the scale benchmarks (cmd/agent's
// BenchmarkScale puts them in the manifests dir, cells/k8sclient's
// BenchmarkDecodeFile decodes them): ClusterIP Services from to to-1
// (numbered from 0), each followed by its EndpointSlice of one endpoint, as
// YAML documents. Service i has ClusterIP 10.(96+i>>16).(i>>8).(i) and its
// endpoint 10.(128+i>>16).(i>>8).(i) on node-(i%100).
func WriteScaleManifests(w io.Writer, from, to int) error {
	for i := from; i < to; i++ {
		svc := fmt.Sprintf("10.%d.%d.%d", 96+i>>16, i>>8&0xff, i&0xff)
		pod := fmt.Sprintf("10.%d.%d.%d", 128+i>>16, i>>8&0xff, i&0xff)
		if _, err := fmt.Fprintf(w, `---
apiVersion: v1
kind: Service
metadata:
  name: svc-%[1]d
  namespace: bench
  labels: {app: svc-%[1]d}
spec:
  type: ClusterIP
  clusterIP: %[2]s
  clusterIPs: [%[2]s]
  selector: {app: svc-%[1]d}
  ports:
  - {name: http, port: 80, protocol: TCP, targetPort: 8080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc-%[1]d-x7k2p
  namespace: bench
  labels: {kubernetes.io/service-name: svc-%[1]d}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [%[3]s]
  conditions: {ready: true}
  nodeName: node-%[4]d
`, i, svc, pod, i%100); err != nil {
			return err
		}
	}
	return nil
}
