package flagcheck

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestHostPort(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:9879":  "",
		":4244":           "",
		"[::1]:80":        "",
		"localhost:0":     "",
		"127.0.0.1:99999": `port "99999" is not a port number`,
		"example.com:80":  `host "example.com" is not an IP address`,
		"127.0.0.1":       "missing port",
	} {
		err := HostPort(addr)
		if (want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("HostPort(%q) = %v, want %q", addr, err, want)
		}
	}
}

func TestCreatable(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		filepath.Join(dir, "a", "b"):       "",
		dir:                                "",
		file:                               "",
		filepath.Join(file, "state"):       file + " is not a directory",
		filepath.Join(file, "x", "y.sock"): file + " is not a directory",
	} {
		err := Creatable(path)
		if (want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("Creatable(%q) = %v, want %q", path, err, want)
		}
	}
}

// A path the caller may not look into is no error: start finds out.
func TestCreatableUnreadable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to check as another user")
	}
	private := filepath.Join(t.TempDir(), "private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(private, "x", "agent.sock")
	// The file system user of this thread alone becomes nobody.
	runtime.LockOSThread()
	unix.Setfsuid(65534)
	_, statErr := os.Stat(path)
	err := Creatable(path)
	unix.Setfsuid(0)
	runtime.UnlockOSThread()
	if !errors.Is(statErr, fs.ErrPermission) {
		t.Skipf("the check did not run as nobody (stat: %v)", statErr)
	}
	if err != nil {
		t.Fatalf("Creatable under a directory nobody may read = %v, want nil", err)
	}
}
