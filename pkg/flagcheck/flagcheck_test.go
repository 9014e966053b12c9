package flagcheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
