// Package pageout hands the resident pages of the running executable back
// to the kernel.
//
// A Go program's code, read-only data and function tables are mapped from
// its executable file, and a page is resident once anything read it. The
// agent's package initializers and its start (decoding the manifests,
// restoring state, the first listings) read far more of a 120 MB binary
// than it uses afterwards: at idle those clean file pages are most of its
// resident set. The process keeps them mapped for as long as it runs, and
// the kernel's reclaim protects mapped executable pages that were used.
//
// [Executable] asks the kernel to page them out (madvise MADV_PAGEOUT,
// Linux 5.4 and later): it unmaps them from the process and frees those it
// can; those it keeps are the file's page cache, reclaimed like any other.
// Nothing is lost: the pages are clean copies of the file, and a page used
// again is mapped back on its next access (a page fault, from the page
// cache or the disk).
package pageout

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Result is what a page-out did.
type Result struct {
	// Mappings is how many read-only mappings of the executable were paged
	// out, MappedBytes their size.
	Mappings    int
	MappedBytes uint64
	// FileBefore and FileAfter are the process's resident file-backed
	// bytes (RssFile) just before and just after.
	FileBefore, FileAfter uint64
}

// ErrUnsupported is returned when the kernel has no MADV_PAGEOUT.
var ErrUnsupported = errors.New("the kernel has no MADV_PAGEOUT (Linux 5.4 or later)")

// Executable pages out the read-only mappings of the running executable:
// its code, read-only data and function tables. Writable mappings (its
// data) are left alone: their pages may hold changes the file does not.
//
// The kernel pages out only what it may: pages mapped by other processes
// too are left, and an unprivileged process that does not own the file
// keeps its pages; FileAfter says what was done.
func Executable() (Result, error) {
	var res Result
	var exe unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &exe); err != nil {
		return res, fmt.Errorf("stat /proc/self/exe: %w", err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return res, err
	}
	ranges, err := readOnlyMappings(maps, exe.Ino)
	if err != nil {
		return res, err
	}
	if len(ranges) == 0 {
		return res, fmt.Errorf("no read-only mapping of the executable (inode %d) in /proc/self/maps", exe.Ino)
	}
	if res.FileBefore, err = residentFile(); err != nil {
		return res, err
	}
	for _, r := range ranges {
		_, _, errno := unix.Syscall(unix.SYS_MADVISE, r.start, r.end-r.start, unix.MADV_PAGEOUT)
		if errno == unix.EINVAL {
			return res, ErrUnsupported
		}
		if errno != 0 {
			return res, fmt.Errorf("madvise %#x-%#x: %w", r.start, r.end, errno)
		}
		res.Mappings++
		res.MappedBytes += uint64(r.end - r.start)
	}
	res.FileAfter, err = residentFile()
	return res, err
}

type addrRange struct{ start, end uintptr }

// readOnlyMappings are the mappings in maps (the text of /proc/PID/maps)
// of the file with inode ino that are not writable. A read-only mapping of
// another file with the same inode number on another device would be
// paged out too, which costs it only a page fault.
func readOnlyMappings(maps []byte, ino uint64) ([]addrRange, error) {
	var out []addrRange
	for line := range strings.Lines(string(maps)) {
		line = strings.TrimSuffix(line, "\n")
		// start-end perms offset dev inode [path]
		f := strings.Fields(line)
		if len(f) < 5 {
			return nil, fmt.Errorf("/proc/self/maps: malformed line %q", line)
		}
		inode, err := strconv.ParseUint(f[4], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("/proc/self/maps: inode in %q: %w", line, err)
		}
		if inode != ino || len(f[1]) < 2 || f[1][1] == 'w' {
			continue
		}
		startS, endS, ok := strings.Cut(f[0], "-")
		start, err1 := strconv.ParseUint(startS, 16, 64)
		end, err2 := strconv.ParseUint(endS, 16, 64)
		if !ok || err1 != nil || err2 != nil || end <= start {
			return nil, fmt.Errorf("/proc/self/maps: address range in %q", line)
		}
		out = append(out, addrRange{uintptr(start), uintptr(end)})
	}
	return out, nil
}

// residentFile is the process's resident file-backed memory (RssFile in
// /proc/self/status), in bytes.
func residentFile() (uint64, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	return statusBytes(status, "RssFile:")
}

// statusBytes reads a "Name:   1234 kB" line of /proc/PID/status.
func statusBytes(status []byte, name string) (uint64, error) {
	for line := range strings.Lines(string(status)) {
		rest, ok := strings.CutPrefix(line, name)
		if !ok {
			continue
		}
		kb, ok := strings.CutSuffix(strings.TrimSpace(rest), " kB")
		n, err := strconv.ParseUint(kb, 10, 64)
		if !ok || err != nil {
			return 0, fmt.Errorf("/proc/self/status: malformed %q", strings.TrimSpace(line))
		}
		return n << 10, nil
	}
	return 0, fmt.Errorf("/proc/self/status: no %s line", name)
}
