package pageout

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

// TestExecutable: the test binary's own read-only mappings are paged out,
// and its resident file-backed memory falls.
func TestExecutable(t *testing.T) {
	res, err := Executable()
	if errors.Is(err, ErrUnsupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if res.Mappings == 0 || res.MappedBytes == 0 {
		t.Fatalf("%+v: no mapping paged out", res)
	}
	if res.FileAfter >= res.FileBefore {
		if os.Geteuid() != 0 {
			t.Skipf("%+v: nothing reclaimed; the kernel pages out a file's pages only for its owner or root", res)
		}
		t.Fatalf("resident file-backed memory %d bytes before, %d after: want less after", res.FileBefore, res.FileAfter)
	}
	t.Logf("%d mappings of %d bytes: resident file-backed memory %d -> %d bytes", res.Mappings, res.MappedBytes, res.FileBefore, res.FileAfter)
}

func TestReadOnlyMappings(t *testing.T) {
	maps := `00400000-00c00000 r-xp 00000000 fd:00 4242 /usr/bin/agent
00c00000-01400000 r--p 00800000 fd:00 4242 /usr/bin/agent
01400000-01500000 rw-p 01000000 fd:00 4242 /usr/bin/agent
01500000-01600000 rw-p 00000000 00:00 0
7f0000000000-7f0000100000 r-xp 00000000 fd:00 99 /usr/lib/libc.so.6
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
`
	got, err := readOnlyMappings([]byte(maps), 4242)
	if err != nil {
		t.Fatal(err)
	}
	want := []addrRange{{0x400000, 0xc00000}, {0xc00000, 0x1400000}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("readOnlyMappings = %x, want the executable's code and read-only data only: %x", got, want)
	}

	for _, bad := range []string{
		"00400000-00c00000 r-xp 00000000 fd:00\n",
		"00400000-00c00000 r-xp 00000000 fd:00 x /usr/bin/agent\n",
		"00c00000-00400000 r-xp 00000000 fd:00 4242 /usr/bin/agent\n",
		"00400000 r-xp 00000000 fd:00 4242 /usr/bin/agent\n",
	} {
		if _, err := readOnlyMappings([]byte(bad), 4242); err == nil || !strings.Contains(err.Error(), "/proc/self/maps") {
			t.Errorf("readOnlyMappings(%q) = %v, want an error naming /proc/self/maps", bad, err)
		}
	}
}

func TestStatusBytes(t *testing.T) {
	status := []byte("Name:\tagent\nRssAnon:\t   13400 kB\nRssFile:\t   55000 kB\n")
	if n, err := statusBytes(status, "RssFile:"); err != nil || n != 55000<<10 {
		t.Errorf("RssFile = %d, %v, want %d", n, err, 55000<<10)
	}
	if _, err := statusBytes(status, "RssShmem:"); err == nil || !strings.Contains(err.Error(), "no RssShmem: line") {
		t.Errorf("missing line: %v, want an error naming it", err)
	}
	if _, err := statusBytes([]byte("RssFile:\t12 MB\n"), "RssFile:"); err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Errorf("malformed line: %v, want an error", err)
	}
}
