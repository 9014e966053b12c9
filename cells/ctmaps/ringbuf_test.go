package ctmaps

import "testing"

// With --monitor-ringbuf-size 0 the ring gets 512 KiB per CPU, a power of
// two from 1 MiB to 64 MiB; a size given is kept.
func TestRingbufSize(t *testing.T) {
	for _, c := range []struct {
		flag uint32
		cpus int
		want uint32
	}{
		{0, 0, 1 << 20},
		{0, 1, 1 << 20},
		{0, 2, 1 << 20},
		{0, 3, 2 << 20},
		{0, 8, 4 << 20},
		{0, 96, 64 << 20},
		{0, 128, 64 << 20},
		{0, 4096, 64 << 20},
		{8192, 2, 8192},
		{16 << 20, 256, 16 << 20},
	} {
		if got := (Config{MonitorRingbufSize: c.flag}).ringbufSize(c.cpus); got != c.want {
			t.Errorf("--monitor-ringbuf-size %d on %d CPUs: %d bytes, want %d", c.flag, c.cpus, got, c.want)
		}
	}
}
