package procstat

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cellium/cellium/pkg/polltest"
)

// The times are utime plus stime in ticks of 1/100 s, counted after the
// command name's last ')' whatever the name holds.
func TestParseStat(t *testing.T) {
	line := "4242 (kube (api) server) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 12 0 500 1000 200\n"
	d, err := parseStat([]byte(line))
	if err != nil || d != 3250*time.Millisecond {
		t.Fatalf("parseStat = %v, %v; want 3.25s", d, err)
	}
	for _, bad := range []string{"4242 no name", "4242 (x) S 1 2", "4242 (x) S 1 2 3 4 5 6 7 8 9 10 ten 75"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q) gave no error", bad)
		}
	}
}

func TestParseRSS(t *testing.T) {
	n, err := parseRSS([]byte("Name:\tx\nVmPeak:\t  9000 kB\nVmRSS:\t  1234 kB\nRssAnon:\t 1000 kB\n"))
	if err != nil || n != 1234*1024 {
		t.Fatalf("parseRSS = %d, %v; want %d", n, err, 1234*1024)
	}
	if _, err := parseRSS([]byte("Name:\tx\n")); err == nil || !strings.Contains(err.Error(), "VmRSS") {
		t.Errorf("no VmRSS line: error %v, want one naming VmRSS", err)
	}
}

// This process: touching 64 MiB grows its resident set by about as much,
// and spinning adds CPU time.
func TestSelf(t *testing.T) {
	before, err := RSS(0)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<20)
	for i := 0; i < len(buf); i += 4096 {
		buf[i] = 1
	}
	after, err := RSS(0)
	if err != nil {
		t.Fatal(err)
	}
	if after < before+48<<20 {
		t.Errorf("RSS %d after touching 64 MiB, %d before: want 48 MiB more at least", after, before)
	}
	buf[0]++ // keeps buf alive until here
	start, err := CPU(0)
	if err != nil {
		t.Fatal(err)
	}
	// Spins (no interval) so that the CPU time grows.
	polltest.Until(t, "CPU time 50 ms past its start", 10*time.Second, 0, func() (bool, string) {
		now, err := CPU(0)
		if err != nil {
			t.Fatal(err)
		}
		return now >= start+50*time.Millisecond, fmt.Sprintf("CPU time %s, %s before spinning", now, start)
	})
	if _, err := CPU(1 << 30); err == nil {
		t.Error("CPU of a process that does not exist gave no error")
	}
}

// The load average is the first field of /proc/loadavg, a number.
func TestLoadAverage(t *testing.T) {
	v := LoadAverage()
	if _, err := strconv.ParseFloat(v, 64); err != nil {
		t.Fatalf("LoadAverage() = %q, not a number: %v", v, err)
	}
}
