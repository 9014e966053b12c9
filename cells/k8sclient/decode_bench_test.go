package k8sclient

import (
	"strings"
	"testing"

	"github.com/cellium/cellium/pkg/scalemanifests"
)

// scaleManifests is a file of n Services, each with an EndpointSlice of one
// endpoint, written as cmd/agent's BenchmarkScale writes them.
func scaleManifests(n int) []byte {
	var sb strings.Builder
	if err := scalemanifests.Write(&sb, 0, n); err != nil {
		panic(err) // a strings.Builder does not fail
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
