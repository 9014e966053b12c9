package k8sclient_test

import (
	"strings"
	"testing"

	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/k8sclient/k8sclienttest"
)

// BenchmarkDecodeFile decodes a file of 1,000 Services and as many
// EndpointSlices, as BenchmarkScale's manifests are written, on one core.
func BenchmarkDecodeFile(b *testing.B) {
	const n = 1000
	var sb strings.Builder
	if err := k8sclienttest.WriteScaleManifests(&sb, 0, n); err != nil {
		b.Fatal(err) // a strings.Builder does not fail
	}
	data := []byte(sb.String())
	decode := k8sclient.NewFileDecoder()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		objs, err := decode("bench.yaml", data)
		if err != nil || objs != 2*n {
			b.Fatal(objs, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*n*b.N), "ns/object")
}
