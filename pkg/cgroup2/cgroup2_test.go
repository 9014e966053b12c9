package cgroup2

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseMount(t *testing.T) {
	for _, tc := range []struct {
		name, mountinfo, want, err string
	}{
		{
			name: "hybrid, after the v1 hierarchies",
			mountinfo: `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:10 master:3 - cgroup2 cgroup2 rw
`,
			want: "/sys/fs/cgroup/unified",
		},
		{
			name:      "unified, no optional fields",
			mountinfo: "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate\n",
			want:      "/sys/fs/cgroup",
		},
		{
			name:      "escaped space",
			mountinfo: `50 23 0:40 / /mnt/my\040cgroups rw - cgroup2 none rw` + "\n",
			want:      "/mnt/my cgroups",
		},
		{
			// A path that merely says cgroup2 is not a cgroup2 mount.
			name:      "none",
			mountinfo: "32 31 0:29 / /cgroup2 rw - cgroup cgroup2 rw,cpu\n",
			err:       "no cgroup2 filesystem is mounted",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseMount(strings.NewReader(tc.mountinfo))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("parseMount = %q, %v; want error %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseMount = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestReadUintAndMemoryStat(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "memory.current"), []byte("4096\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.stat"), []byte("anon 1\nkernel 8192\ninactive_file 12\nbad x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n, err := ReadUint(dir, "memory.current"); err != nil || n != 4096 {
		t.Errorf("ReadUint(memory.current) = %d, %v; want 4096", n, err)
	}
	for key, want := range map[string]uint64{"kernel": 8192, "inactive_file": 12, "anon": 1} {
		if n, err := MemoryStat(dir, key); err != nil || n != want {
			t.Errorf("MemoryStat(%s) = %d, %v; want %d", key, n, err, want)
		}
	}
	if _, err := MemoryStat(dir, "file"); err == nil {
		t.Error("MemoryStat(file): no error for a missing key")
	}
	if _, err := MemoryStat(dir, "bad"); err == nil {
		t.Error("MemoryStat(bad): no error for a value that is no number")
	}
	if _, err := ReadUint(dir, "memory.stat"); err == nil {
		t.Error("ReadUint(memory.stat): no error for a file that is no number")
	}
}
