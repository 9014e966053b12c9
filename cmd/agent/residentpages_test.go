package main

import (
	"bufio"
	"debug/dwarf"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The kinds of bytes in the executable that residentPages tells apart.
const (
	kindText     = iota // .text: functions
	kindTypes           // .rodata's type descriptors (type:*), by DWARF's runtime type of each
	kindRodata          // the rest of .rodata: strings, itabs, dictionaries, tables
	kindPclntab         // .gopclntab: each function's _func, name and pc tables
	kindFuncdata        // .gopclntab's go:func.*: each function's stack maps
	kindData            // .noptrdata, .data: variables' initial values, read but not written
	numKinds
)

var kindNames = [numKinds]string{"text", "types", "rodata", "pclntab", "funcdata", "data"}

// residentPages is which of an executable's bytes a process holds in its
// page table, summed by Go package: the process's /proc/PID/pagemap (a
// page's present bit) for the mappings of its executable, each resident
// page's bytes attributed to the symbol they belong to in the executable
// (functions from its symbol table, type descriptors from its DWARF, pc
// tables and stack maps from its pclntab), and the symbol to its package.
// A page is resident if the process touched it or if the kernel mapped
// it with a touched neighbour (fault-around maps the cached pages of the
// touched page's 64 KB block), so a package's figure is what its place in
// the binary costs, not only what ran of it.
type residentPages struct {
	sections []sectionPages
	packages []packagePages
	// total is the resident bytes of the executable's mappings, whichever
	// section they hold.
	total uint64
}

type sectionPages struct {
	name           string
	size, resident uint64
}

type packagePages struct {
	name  string
	bytes [numKinds]uint64
	// linked is the package's bytes in the executable, resident or not.
	linked uint64
}

func (p packagePages) total() (n uint64) {
	for _, b := range p.bytes {
		n += b
	}
	return n
}

// span is a run of the executable's virtual addresses from addr up to the
// next span's, owned by a package.
type span struct {
	addr uint64
	pkg  string
	kind int
}

// readResidentPages attributes the resident pages of process pid's
// executable.
func readResidentPages(pid int) (*residentPages, error) {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return nil, err
	}
	f, err := elf.Open(exe)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	spans, err := executableSpans(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", exe, err)
	}
	maps, err := executableMappings(pid, exe)
	if err != nil {
		return nil, err
	}
	pagemap, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return nil, err
	}
	defer pagemap.Close()

	r := &residentPages{}
	var sections []*elf.Section
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_ALLOC != 0 && s.Type == elf.SHT_PROGBITS && s.Size > 0 {
			sections = append(sections, s)
			r.sections = append(r.sections, sectionPages{name: s.Name, size: s.Size})
		}
	}
	byPkg := map[string]*packagePages{}
	linked := map[string]*packagePages{}
	for _, s := range sections {
		attribute(spans, s.Addr, s.Addr+s.Size, linked)
	}
	pageSize := uint64(os.Getpagesize())
	for _, m := range maps {
		n := (m.end - m.start) / pageSize
		entries := make([]byte, 8*n)
		if _, err := pagemap.ReadAt(entries, int64(m.start/pageSize*8)); err != nil {
			return nil, fmt.Errorf("pagemap of %d: %w", pid, err)
		}
		for i := range n {
			if binary.LittleEndian.Uint64(entries[8*i:])&(1<<63) == 0 {
				continue
			}
			r.total += pageSize
			off := m.offset + i*pageSize
			for j, s := range sections {
				lo, hi := max(off, s.Offset), min(off+pageSize, s.Offset+s.Size)
				if lo >= hi {
					continue
				}
				r.sections[j].resident += hi - lo
				attribute(spans, s.Addr+lo-s.Offset, s.Addr+hi-s.Offset, byPkg)
			}
		}
	}
	for name, l := range linked {
		p := byPkg[name]
		if p == nil {
			p = &packagePages{name: name}
		}
		p.linked = l.total()
		r.packages = append(r.packages, *p)
	}
	sort.Slice(r.packages, func(i, j int) bool { return r.packages[i].total() > r.packages[j].total() })
	return r, nil
}

// attribute adds the addresses [lo, hi) to the packages of the spans
// holding them.
func attribute(spans []span, lo, hi uint64, byPkg map[string]*packagePages) {
	i := sort.Search(len(spans), func(i int) bool { return spans[i].addr > lo }) - 1
	for addr := lo; addr < hi; i++ {
		end := hi
		if i+1 < len(spans) {
			end = min(hi, spans[i+1].addr)
		}
		pkg, kind := "(before the first symbol)", kindRodata
		if i >= 0 {
			pkg, kind = spans[i].pkg, spans[i].kind
		}
		p := byPkg[pkg]
		if p == nil {
			p = &packagePages{name: pkg}
			byPkg[pkg] = p
		}
		p.bytes[kind] += end - addr
		addr = end
	}
}

type mapping struct{ start, end, offset uint64 }

// executableMappings is the mappings of exe in /proc/PID/maps.
func executableMappings(pid int, exe string) ([]mapping, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var maps []mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[5] != exe {
			continue
		}
		start, end, _ := strings.Cut(fields[0], "-")
		var m mapping
		var err1, err2, err3 error
		m.start, err1 = strconv.ParseUint(start, 16, 64)
		m.end, err2 = strconv.ParseUint(end, 16, 64)
		m.offset, err3 = strconv.ParseUint(fields[2], 16, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("/proc/%d/maps: line %q", pid, sc.Text())
		}
		maps = append(maps, m)
	}
	if len(maps) == 0 {
		return nil, fmt.Errorf("/proc/%d/maps has no mapping of %s", pid, exe)
	}
	return maps, sc.Err()
}

// executableSpans is the owners of a Go executable's addresses: its
// symbol table's symbols, with type:* split by the DWARF types' runtime
// type descriptors and the pclntab by function.
func executableSpans(f *elf.File) ([]span, error) {
	syms, err := f.Symbols()
	if err != nil {
		return nil, err
	}
	var spans []span
	sym := map[string]uint64{}
	for _, s := range syms {
		if s.Section == elf.SHN_UNDEF || int(s.Section) >= len(f.Sections) {
			continue
		}
		sym[s.Name] = s.Value
		sec := f.Sections[s.Section]
		kind := kindRodata
		switch {
		case sec.Name == ".text":
			kind = kindText
		case sec.Name == ".noptrdata" || sec.Name == ".data":
			kind = kindData
		case sec.Name == ".gopclntab":
			kind = kindPclntab
		case sec.Name != ".rodata" && sec.Name != ".typelink" && sec.Name != ".itablink":
			continue
		}
		spans = append(spans, span{addr: s.Value, pkg: symbolPackage(s.Name), kind: kind})
	}
	types, err := dwarfTypeSpans(f, sym["runtime.types"])
	if err != nil {
		return nil, err
	}
	spans = append(spans, types...)
	pcln, err := pclntabSpans(f, sym["go:func.*"])
	if err != nil {
		return nil, err
	}
	spans = append(spans, pcln...)
	// The finer spans win at an address that also starts a symbol
	// (type:* and the first type descriptor): the later ones.
	slices.SortStableFunc(spans, func(a, b span) int {
		switch {
		case a.addr < b.addr:
			return -1
		case a.addr > b.addr:
			return 1
		}
		return 0
	})
	out := spans[:0]
	for _, s := range spans {
		if len(out) > 0 && out[len(out)-1].addr == s.addr {
			out[len(out)-1] = s
			continue
		}
		out = append(out, s)
	}
	return out, nil
}

// dwarfTypeSpans is the type descriptor of each type in f's DWARF, by its
// DW_AT_go_runtime_type (an offset from runtime.types, at types).
func dwarfTypeSpans(f *elf.File, types uint64) ([]span, error) {
	const attrGoRuntimeType = dwarf.Attr(0x2904)
	d, err := f.DWARF()
	if err != nil {
		return nil, fmt.Errorf("DWARF (built with -w?): %w", err)
	}
	var spans []span
	rd := d.Reader()
	for {
		e, err := rd.Next()
		if err != nil {
			return nil, err
		}
		if e == nil {
			break
		}
		if e.Tag == dwarf.TagCompileUnit {
			continue
		}
		addr, ok := e.Val(attrGoRuntimeType).(uint64)
		name, _ := e.Val(dwarf.AttrName).(string)
		if ok && addr != 0 {
			spans = append(spans, span{addr: types + addr, pkg: symbolPackage(name), kind: kindTypes})
		}
		if e.Children {
			rd.SkipChildren()
		}
	}
	return spans, nil
}

// pclntabSpans is each function's parts of the pclntab (Go 1.20's
// layout: runtime/symtab.go's pcHeader and _func): its _func, its name,
// the pc tables it starts, and its stack maps in go:func.* (at gofunc).
func pclntabSpans(f *elf.File, gofunc uint64) ([]span, error) {
	sec := f.Section(".gopclntab")
	if sec == nil {
		return nil, fmt.Errorf("no .gopclntab section")
	}
	data, err := sec.Data()
	if err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	if len(data) < 72 || le.Uint32(data) != 0xfffffff1 || data[7] != 8 {
		return nil, fmt.Errorf(".gopclntab: not Go 1.20's 64-bit layout (magic %#x)", le.Uint32(data))
	}
	nfunc := le.Uint64(data[8:])
	funcname, cutab, pctab, pcln := le.Uint64(data[32:]), le.Uint64(data[40:]), le.Uint64(data[56:]), le.Uint64(data[64:])
	spans := []span{
		{addr: sec.Addr, pkg: "(pclntab header)", kind: kindPclntab},
		{addr: sec.Addr + cutab, pkg: "(pclntab file tables)", kind: kindPclntab},
		{addr: sec.Addr + pctab, pkg: "(pclntab pc tables)", kind: kindPclntab},
		{addr: sec.Addr + pcln, pkg: "(pclntab function table)", kind: kindPclntab},
	}
	firstPctab := map[uint32]bool{}
	for i := range nfunc {
		funcoff := pcln + uint64(le.Uint32(data[pcln+8*i+4:]))
		fn := data[funcoff:]
		nameOff := uint64(le.Uint32(fn[4:]))
		name := data[funcname+nameOff:]
		name = name[:slices.Index(name, 0)]
		pkg := symbolPackage(string(name))
		spans = append(spans,
			span{addr: sec.Addr + funcoff, pkg: pkg, kind: kindPclntab},
			span{addr: sec.Addr + funcname + nameOff, pkg: pkg, kind: kindPclntab})
		npcdata, nfuncdata := le.Uint32(fn[28:]), uint32(fn[43])
		tables := []uint32{le.Uint32(fn[16:]), le.Uint32(fn[20:]), le.Uint32(fn[24:])}
		for j := range npcdata {
			tables = append(tables, le.Uint32(fn[44+4*j:]))
		}
		for _, off := range tables {
			if off != 0 && !firstPctab[off] {
				firstPctab[off] = true
				spans = append(spans, span{addr: sec.Addr + pctab + uint64(off), pkg: pkg, kind: kindPclntab})
			}
		}
		for j := range nfuncdata {
			off := le.Uint32(fn[44+4*npcdata+4*j:])
			if off != ^uint32(0) && gofunc != 0 {
				spans = append(spans, span{addr: gofunc + uint64(off), pkg: pkg, kind: kindFuncdata})
			}
		}
	}
	return spans, nil
}

// symbolPackage is the package of a Go symbol or type name: the import
// path up to the first dot after its last slash, without type:, pointer,
// slice or array marks; other composite types and the linker's own
// symbols are named as they are.
func symbolPackage(symbol string) string {
	name := strings.TrimPrefix(symbol, "type:")
	name = strings.TrimPrefix(name, ".eq.") // a type's equality function
	name = strings.TrimLeft(name, "*[]0123456789")
	if strings.HasPrefix(name, "go:") || strings.HasPrefix(name, "map[") || strings.HasPrefix(name, "func(") ||
		strings.HasPrefix(name, "struct {") || strings.HasPrefix(name, "interface {") || strings.HasPrefix(name, "chan ") {
		if i := strings.IndexAny(name, ".*["); i > 0 && strings.HasPrefix(name, "go:") {
			return name[:i] + "*"
		}
		return "(composite types)"
	}
	path := name
	if path == "" {
		return symbol
	}
	if i := strings.IndexAny(path, "[("); i >= 0 {
		path = path[:i]
	}
	slash := strings.LastIndex(path, "/")
	if dot := strings.Index(path[slash+1:], "."); dot >= 0 {
		return name[:slash+1+dot]
	}
	return path
}

// write prints the sections' resident MB, then the top modules' and
// packages': their bytes in the executable (linked) and resident (MB, and
// its parts).
func (r *residentPages) write(w io.Writer, top int) {
	fmt.Fprintf(w, "resident pages of the executable: %.1f MB\n", mib(r.total))
	for _, s := range r.sections {
		fmt.Fprintf(w, "  %-12s %6.1f of %6.1f MB\n", s.name, mib(s.resident), mib(s.size))
	}
	writePackages(w, "module", r.modules(), top)
	writePackages(w, "package", r.packages, top)
}

func mib(n uint64) float64 { return float64(n) / (1 << 20) }

func writePackages(w io.Writer, what string, pkgs []packagePages, top int) {
	fmt.Fprintf(w, "  %-60s %6s %6s", what, "linked", "MB")
	for _, k := range kindNames {
		fmt.Fprintf(w, " %8s", k)
	}
	fmt.Fprintln(w)
	for i, p := range pkgs {
		if i == top {
			break
		}
		fmt.Fprintf(w, "  %-60s %6.2f %6.2f", p.name, mib(p.linked), mib(p.total()))
		for _, b := range p.bytes {
			fmt.Fprintf(w, " %8.2f", mib(b))
		}
		fmt.Fprintln(w)
	}
}

// modules sums the packages by their first path elements (the module,
// near enough: three elements for a host name, else the first).
func (r *residentPages) modules() []packagePages {
	byMod := map[string]*packagePages{}
	for _, p := range r.packages {
		parts := strings.Split(p.name, "/")
		mod := parts[0]
		if strings.Contains(parts[0], ".") && len(parts) >= 3 {
			mod = strings.Join(parts[:3], "/")
		}
		m := byMod[mod]
		if m == nil {
			m = &packagePages{name: mod}
			byMod[mod] = m
		}
		for k, b := range p.bytes {
			m.bytes[k] += b
		}
		m.linked += p.linked
	}
	var out []packagePages
	for _, m := range byMod {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].total() > out[j].total() })
	return out
}

// TestResidentPages checks the attribution on the built agent, left
// waiting in `agent monitor` for an API socket that accepts and never
// answers: its start ran cobra's command code, so that is resident, and
// the bytes attributed add up to the sections' resident bytes.
func TestResidentPages(t *testing.T) {
	for name, want := range map[string]string{
		"k8s.io/api/core/v1.(*Pod).Marshal":           "k8s.io/api/core/v1",
		"type:*k8s.io/api/core/v1.Pod":                "k8s.io/api/core/v1",
		"k8s.io/api/core/v1.init.0":                   "k8s.io/api/core/v1",
		"github.com/cilium/statedb.(*Table[...]).Get": "github.com/cilium/statedb",
		"go:itab.*foo.T,bar.I":                        "go:itab*",
		"map[string]*k8s.io/api/core/v1.Pod":          "(composite types)",
		"runtime.mallocgc":                            "runtime",
		"type:.eq.github.com/cilium/statedb.Revision": "github.com/cilium/statedb",
	} {
		if got := symbolPackage(name); got != want {
			t.Errorf("symbolPackage(%q) = %q, want %q", name, got, want)
		}
	}

	sock := filepath.Join(t.TempDir(), "api.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			accepted <- c
		}
	}()
	cmd := exec.Command(agentBin, "monitor", "--api-socket", sock, "--timeout", "1h")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	select {
	case c := <-accepted:
		defer c.Close()
	case <-time.After(time.Minute):
		t.Fatal("agent monitor did not connect to its API socket in a minute")
	}
	r, err := readResidentPages(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	var sections, packages uint64
	for _, s := range r.sections {
		sections += s.resident
	}
	for _, p := range r.packages {
		packages += p.total()
	}
	if sections != packages || sections == 0 || sections > r.total {
		t.Errorf("sections hold %d resident bytes, packages %d, the mappings %d", sections, packages, r.total)
	}
	var cobra packagePages
	for _, p := range r.packages {
		if p.name == "github.com/spf13/cobra" {
			cobra = p
		}
	}
	if cobra.bytes[kindText] == 0 || cobra.bytes[kindPclntab] == 0 || cobra.bytes[kindTypes] == 0 {
		t.Errorf("package cobra has no resident text, pclntab or types: %+v", cobra)
	}
	// The type descriptors are most of .rodata, and each is attributed to
	// its type: little is left to type:* itself (the type names before the
	// first descriptor).
	var rodata, types, unattributed uint64
	for _, s := range r.sections {
		if s.name == ".rodata" {
			rodata = s.resident
		}
	}
	for _, p := range r.packages {
		types += p.bytes[kindTypes]
		if p.name == "type:*" {
			unattributed = p.total()
		}
	}
	if types < rodata/2 || unattributed > rodata/4 {
		t.Errorf("of .rodata's %d resident bytes, %d are attributed to types and %d left to type:*", rodata, types, unattributed)
	}
	var out strings.Builder
	r.write(&out, 100)
	t.Logf("agent monitor, waiting:\n%s", out.String())
}
