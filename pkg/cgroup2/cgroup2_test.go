package cgroup2

import (
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
