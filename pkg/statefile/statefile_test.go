package statefile_test

import (
	"bytes"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/statefile"
)

// writers are Write and WriteUnsynced, which differ only in what a crash
// of the kernel may take: for the agent and its readers both replace a
// file in one step.
var writers = []struct {
	name  string
	write func(string, []byte) error
}{{"Write", statefile.Write}, {"WriteUnsynced", statefile.WriteUnsynced}}

func TestWriteReplacesAndLeavesNoTemp(t *testing.T) {
	for _, w := range writers {
		t.Run(w.name, func(t *testing.T) { testWriteReplacesAndLeavesNoTemp(t, w.write) })
	}
}

func testWriteReplacesAndLeavesNoTemp(t *testing.T, write func(string, []byte) error) {
	dir := t.TempDir()
	path := filepath.Join(dir, "endpoint.json")
	for _, content := range []string{"first", "second, longer than the first"} {
		if err := write(path, []byte(content)); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != content {
			t.Fatalf("read back %q, %v; want %q", got, err, content)
		}
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file mode %v, %v; want 0600", fi.Mode(), err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("directory holds %d entries after writes, want only the state file", len(entries))
	}
}

// A reader racing the writer sees one whole version or the other, never a
// truncated or mixed file: what a restore after a crash would read.
func TestWriteIsAtomicForReaders(t *testing.T) {
	for _, w := range writers {
		t.Run(w.name, func(t *testing.T) { testWriteIsAtomicForReaders(t, w.write) })
	}
}

func testWriteIsAtomicForReaders(t *testing.T, write func(string, []byte) error) {
	path := filepath.Join(t.TempDir(), "state.json")
	a := bytes.Repeat([]byte("a"), 1<<16)
	b := bytes.Repeat([]byte("b"), 1<<17)
	if err := write(path, a); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(done)
		for i := range 50 {
			next := a
			if i%2 == 0 {
				next = b
			}
			if err := write(path, next); err != nil {
				t.Error(err)
				return
			}
		}
	})
	reads := 0
	for {
		select {
		case <-done:
			wg.Wait()
			if reads == 0 {
				t.Fatal("the reader never ran")
			}
			return
		default:
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("read during writes: %v", err)
		}
		if !bytes.Equal(got, a) && !bytes.Equal(got, b) {
			t.Fatalf("read a file of %d bytes that is neither version", len(got))
		}
		reads++
	}
}

// A crash in the middle of Write leaves the old file and a temporary one;
// the restore removes the temporary file and keeps the old content.
func TestRemoveTempsAfterCrash(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "10.244.0.5.json")
	if err := statefile.Write(path, []byte("old")); err != nil {
		t.Fatal(err)
	}
	// What a crash between write and rename leaves behind.
	if err := os.WriteFile(path+statefile.TempSuffix, []byte("ne"), 0o600); err != nil {
		t.Fatal(err)
	}
	removed, err := statefile.RemoveTemps(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{path + statefile.TempSuffix}) {
		t.Fatalf("removed %v, want the temporary file", removed)
	}
	if got, _ := os.ReadFile(path); string(got) != "old" {
		t.Fatalf("state file after the restore = %q, want the old content", got)
	}
	if removed, err := statefile.RemoveTemps(filepath.Join(dir, "missing")); err != nil || removed != nil {
		t.Fatalf("RemoveTemps of a missing directory = %v, %v; want nothing", removed, err)
	}
}

func TestWriteFailureKeepsOldFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := statefile.Write(path, []byte("old")); err != nil {
		t.Fatal(err)
	}
	// A directory where the temporary file goes makes the write fail.
	if err := os.Mkdir(path+statefile.TempSuffix, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := statefile.Write(path, []byte("new")); err == nil {
		t.Fatal("write over a blocked temporary file succeeded")
	}
	if got, _ := os.ReadFile(path); string(got) != "old" {
		t.Fatalf("state file after a failed write = %q, want the old content", got)
	}
}

func TestRemoveAndMove(t *testing.T) {
	dir := t.TempDir()
	ep := filepath.Join(dir, "endpoints", "7")
	if err := statefile.MkdirAll(ep); err != nil {
		t.Fatal(err)
	}
	if err := statefile.Write(filepath.Join(ep, "endpoint.json"), []byte("{")); err != nil {
		t.Fatal(err)
	}
	invalid := filepath.Join(dir, "endpoints-invalid")
	if err := statefile.MkdirAll(invalid); err != nil {
		t.Fatal(err)
	}
	moved := filepath.Join(invalid, "7")
	if err := statefile.Move(ep, moved); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(moved, "endpoint.json")); err != nil {
		t.Fatalf("moved state: %v", err)
	}
	if err := statefile.Remove(moved); err != nil {
		t.Fatal(err)
	}
	if err := statefile.Remove(moved); err != nil {
		t.Fatalf("removing what is gone: %v", err)
	}
	if _, err := os.Stat(moved); !os.IsNotExist(err) {
		t.Fatalf("removed state still there: %v", err)
	}
}

func TestMoveAside(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "7.json")
	if err := os.WriteFile(bad, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	invalid := filepath.Join(dir, "invalid")
	to, err := statefile.MoveAside(bad, invalid)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(to) != invalid || !strings.HasPrefix(filepath.Base(to), "7.json.") {
		t.Fatalf("moved to %s, want %s/7.json.<time>", to, invalid)
	}
	if b, err := os.ReadFile(to); err != nil || string(b) != "{" {
		t.Fatalf("moved file: %q %v", b, err)
	}
	if _, err := os.Stat(bad); !os.IsNotExist(err) {
		t.Fatalf("original still there: %v", err)
	}
}

// ReadRegular reads a regular file; anything else is ErrNotRegular at once,
// without blocking on a FIFO that has no writer; a missing file is
// fs.ErrNotExist.
func TestReadRegular(t *testing.T) {
	dir := t.TempDir()
	regular := filepath.Join(dir, "regular")
	os.WriteFile(regular, []byte("content"), 0o600)
	if got, err := statefile.ReadRegular(regular); err != nil || string(got) != "content" {
		t.Fatalf("ReadRegular(regular file) = %q, %v", got, err)
	}
	if _, err := statefile.ReadRegular(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("ReadRegular(missing) = %v, want fs.ErrNotExist", err)
	}

	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // releases a reader blocked before the fix
		if fd, err := unix.Open(fifo, unix.O_RDWR|unix.O_NONBLOCK, 0); err == nil {
			unix.Close(fd)
		}
	})
	sub := filepath.Join(dir, "dir")
	os.Mkdir(sub, 0o700)
	link := filepath.Join(dir, "link")
	os.Symlink(regular, link)
	sock := filepath.Join(dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	for _, tc := range []struct{ path, want string }{
		{fifo, "is a named pipe (FIFO)"},
		{sub, "is a directory"},
		{link, "is a symbolic link"},
		{sock, "is a socket"},
		{"/dev/null", "is a character device"},
	} {
		done := make(chan error, 1)
		go func() {
			_, err := statefile.ReadRegular(tc.path)
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, statefile.ErrNotRegular) || !strings.Contains(err.Error(), tc.path+" "+tc.want) {
				t.Errorf("ReadRegular(%s) = %v, want ErrNotRegular saying %q", tc.path, err, tc.want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("ReadRegular(%s) did not return within 10s", tc.path)
		}
	}
}
