package k8sclient

import (
	"fmt"
	"strings"
	"testing"
)

// scaleManifests is a file of n Services, each with an EndpointSlice of one
// endpoint, written as cmd/agent's BenchmarkScale writes them.
func scaleManifests(n int) []byte {
	var sb strings.Builder
	for i := range n {
		svc := fmt.Sprintf("10.%d.%d.%d", 96+i>>16, i>>8&0xff, i&0xff)
		pod := fmt.Sprintf("10.%d.%d.%d", 128+i>>16, i>>8&0xff, i&0xff)
		fmt.Fprintf(&sb, `---
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
`, i, svc, pod, i%100)
	}
	return []byte(sb.String())
}

// BenchmarkDecodeFile decodes a file of 1,000 Services and as many
// EndpointSlices, as BenchmarkScale's manifests are written, on one core.
func BenchmarkDecodeFile(b *testing.B) {
	const n = 1000
	data := scaleManifests(n)
	d := newDecoder()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		objs, err := d.decodeFile("bench.yaml", data)
		if err != nil || len(objs) != 2*n {
			b.Fatal(len(objs), err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*n*b.N), "ns/object")
}
