package main

import (
	"bufio"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// syscallCounts are the system calls of a process that the ADD's cost is
// made of, counted by countCalls: the netlink requests it sent, by
// message type (RTM_NEWLINK, ...), and its syncs of files and
// directories.
type syscallCounts struct {
	netlink map[string]int
	syncs   int
	// sockets counts the netlink sockets opened.
	sockets int
}

// countCalls runs fn with strace attached to every thread of process pid
// and counts the process's netlink requests (sendto/sendmsg on a netlink
// socket, by message type, as strace decodes them), its fsync and
// fdatasync calls and the netlink sockets it opened meanwhile. strace slows the process down: what fn
// measures under it is not a latency figure. It skips b when strace is not
// installed.
func countCalls(b *testing.B, pid int, fn func()) syscallCounts {
	b.Helper()
	strace, err := exec.LookPath("strace")
	if err != nil {
		b.Skipf("counting the agent's system calls needs strace: %v", err)
	}
	out := filepath.Join(b.TempDir(), "strace.out")
	cmd := exec.Command(strace, "-f", "-e", "trace=sendto,sendmsg,fsync,fdatasync,socket", "-e", "signal=none", "-o", out, "-p", strconv.Itoa(pid))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	// strace says "Process N attached with M threads" once it traces
	// every thread of the process.
	lines := bufio.NewScanner(stderr)
	attached := false
	var said []string
	for !attached && lines.Scan() {
		said = append(said, lines.Text())
		attached = strings.Contains(lines.Text(), "attached")
	}
	if !attached {
		cmd.Wait()
		b.Skipf("strace did not attach to the agent: %s", strings.Join(said, "; "))
	}
	go func() {
		for lines.Scan() {
		}
	}()
	fn()
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		b.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			b.Fatal(err)
		}
	}
	data, err := os.ReadFile(out)
	if err != nil {
		b.Fatal(err)
	}
	return parseCalls(string(data))
}

var nlmsgType = regexp.MustCompile(`nlmsg_type=(0x[0-9a-f]+|[A-Z][A-Z0-9_]*|[0-9]+)`)

// rtmNames name the rtnetlink message types an ADD sends, for a socket
// strace cannot decode (one in another network namespace shows them as
// numbers).
var rtmNames = map[uint64]string{
	unix.RTM_NEWLINK: "RTM_NEWLINK", unix.RTM_DELLINK: "RTM_DELLINK", unix.RTM_GETLINK: "RTM_GETLINK", unix.RTM_SETLINK: "RTM_SETLINK",
	unix.RTM_NEWADDR: "RTM_NEWADDR", unix.RTM_DELADDR: "RTM_DELADDR", unix.RTM_GETADDR: "RTM_GETADDR",
	unix.RTM_NEWROUTE: "RTM_NEWROUTE", unix.RTM_DELROUTE: "RTM_DELROUTE", unix.RTM_GETROUTE: "RTM_GETROUTE",
	unix.RTM_NEWQDISC: "RTM_NEWQDISC", unix.RTM_GETQDISC: "RTM_GETQDISC",
	unix.RTM_NEWTFILTER: "RTM_NEWTFILTER", unix.RTM_DELTFILTER: "RTM_DELTFILTER", unix.RTM_GETTFILTER: "RTM_GETTFILTER",
}

// parseCalls counts strace's lines of sendto/sendmsg with a netlink
// header, of fsync/fdatasync and of netlink sockets opened; a call strace
// split in two lines
// ("<unfinished ...>", "<... fsync resumed>") counts once, at its start.
func parseCalls(out string) syscallCounts {
	c := syscallCounts{netlink: map[string]int{}}
	for line := range strings.Lines(out) {
		switch {
		case strings.Contains(line, "fsync(") || strings.Contains(line, "fdatasync("):
			c.syncs++
		case strings.Contains(line, "socket(AF_NETLINK,"):
			c.sockets++
		case strings.Contains(line, "sendto(") || strings.Contains(line, "sendmsg("):
			if m := nlmsgType.FindStringSubmatch(line); m != nil {
				name := m[1]
				if n, err := strconv.ParseUint(name, 0, 16); err == nil {
					if rtmNames[n] != "" {
						name = rtmNames[n]
					} else {
						name = "type_" + name
					}
				}
				c.netlink[name]++
			}
		}
	}
	return c
}

// perAdd prints the counts divided by adds, as fields of a bench line.
func (c syscallCounts) perAdd(adds int) string {
	total := 0
	var types []string
	for _, t := range slices.Sorted(maps.Keys(c.netlink)) {
		total += c.netlink[t]
		types = append(types, fmt.Sprintf("%s=%.1f", strings.ToLower(t), float64(c.netlink[t])/float64(adds)))
	}
	return fmt.Sprintf("netlink_per_add=%.1f netlink_sockets_per_add=%.1f fsync_per_add=%.1f %s", float64(total)/float64(adds),
		float64(c.sockets)/float64(adds), float64(c.syncs)/float64(adds), strings.Join(types, " "))
}

// TestParseCalls counts strace's lines as BenchmarkAddParallel reads them:
// netlink requests by type (named or numbered), syncs, a split call once.
func TestParseCalls(t *testing.T) {
	out := `101 sendto(7, [{nlmsg_len=40, nlmsg_type=RTM_GETLINK, nlmsg_flags=NLM_F_REQUEST|NLM_F_ACK, nlmsg_seq=1, nlmsg_pid=0}, ...], 40, 0, {sa_family=AF_NETLINK, nl_pid=0, nl_groups=00000000}, 12) = 40
102 sendto(9, [{nlmsg_len=60, nlmsg_type=0x14 /* NLMSG_??? */, nlmsg_flags=NLM_F_REQUEST|NLM_F_ACK, nlmsg_seq=2, nlmsg_pid=0}, "..."], 60, 0, {sa_family=AF_NETLINK, nl_pid=0, nl_groups=00000000}, 12) = 60
103 fsync(12 <unfinished ...>
104 fdatasync(13) = 0
103 <... fsync resumed>) = 0
105 sendto(3, "GET / HTTP/1.1", 14, 0, NULL, 0) = 14
106 socket(AF_NETLINK, SOCK_RAW|SOCK_CLOEXEC, NETLINK_ROUTE) = 14
107 socket(AF_UNIX, SOCK_STREAM|SOCK_CLOEXEC, 0) = 15
`
	c := parseCalls(out)
	if want := map[string]int{"RTM_GETLINK": 1, "RTM_NEWADDR": 1}; !maps.Equal(c.netlink, want) || c.syncs != 2 || c.sockets != 1 {
		t.Errorf("parseCalls = %v, %d syncs, %d netlink sockets; want %v, 2 syncs, 1 socket", c.netlink, c.syncs, c.sockets, want)
	}
	if got, want := c.perAdd(2), "netlink_per_add=1.0 netlink_sockets_per_add=0.5 fsync_per_add=1.0 rtm_getlink=0.5 rtm_newaddr=0.5"; got != want {
		t.Errorf("perAdd = %q, want %q", got, want)
	}
}
