package loadbalancer

import (
	"testing"
	"unsafe"
)

// The rows kept per Service address stay in the allocation size classes
// they were packed for: one more field or a field out of order moves a
// row up a class, 16 or 32 bytes more for each of 50,000 Services.
func TestRowSizes(t *testing.T) {
	for _, c := range []struct {
		name      string
		size, max uintptr
	}{
		{"Service", unsafe.Sizeof(Service{}), 144},
		{"Frontend", unsafe.Sizeof(Frontend{}), 144},
		{"SliceBackends", unsafe.Sizeof(SliceBackends{}), 72},
		{"Backend", unsafe.Sizeof(Backend{}), 72},
	} {
		if c.size > c.max {
			t.Errorf("%s is %d bytes, want at most %d", c.name, c.size, c.max)
		}
	}
}
