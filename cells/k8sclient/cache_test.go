package k8sclient

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// servicePorts starts the cell on dir with its state in run, and returns
// the embedded server's services' ports by name.
func servicePorts(t *testing.T, dir, run string) map[string]int32 {
	t.Helper()
	var cs Clientset
	h := embeddedHiveIn(t, dir, run, cell.Invoke(func(c Clientset) { cs = c }))
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	defer h.Stop(log, context.Background())
	list, err := cs.CoreV1().Services("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ports := map[string]int32{}
	for _, svc := range list.Items {
		ports[svc.Name] = svc.Spec.Ports[0].Port
	}
	return ports
}

func TestParseCache(t *testing.T) {
	dir, run := t.TempDir(), t.TempDir()
	a := servicesFile("a", 2, 80)
	writeFile(t, filepath.Join(dir, "a.yaml"), a)
	writeFile(t, filepath.Join(dir, "b.yaml"), servicesFile("b", 1, 80))
	cache := &parseCache{dir: filepath.Join(run, "state", "k8s-manifests")}

	if ports := servicePorts(t, dir, run); len(ports) != 3 {
		t.Fatalf("first start: services %v, want 3", ports)
	}

	// While the agent is down: a.yaml's cache is made to say port 8080,
	// which a restart must serve, since the file is unchanged and a cache
	// is read in its place; b.yaml changes, so its cache must not be read;
	// its cache is damaged besides. A file that is gone left its cache.
	objs, ok := cache.load("a.yaml", contentDigest(a))
	if !ok || len(objs) != 2 {
		t.Fatalf("cache of a.yaml: %d objects, found %v; want the 2 of the first start", len(objs), ok)
	}
	for i := range objs {
		m := &objs[i]
		svc := decodedObject(t, *m).(*corev1.Service)
		svc.Spec.Ports[0].Port = 8080
		if err := m.setObject(svc); err != nil {
			t.Fatal(err)
		}
	}
	if err := cache.store("a.yaml", contentDigest(a), objs); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "b.yaml"), servicesFile("b", 1, 81))
	if err := os.WriteFile(cache.path("b.yaml"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cache.path("gone.yaml"), []byte("stale"), 0o600); err != nil {
		t.Fatal(err)
	}

	ports := servicePorts(t, dir, run)
	for name, want := range map[string]int32{"a-0": 8080, "a-1": 8080, "b-0": 81} {
		if ports[name] != want {
			t.Errorf("after the restart service %s has port %d, want %d", name, ports[name], want)
		}
	}
	if _, err := os.Stat(cache.path("gone.yaml")); !os.IsNotExist(err) {
		t.Errorf("the cache of a removed file is still there: %v", err)
	}
	if _, ok := cache.load("b.yaml", contentDigest(servicesFile("b", 1, 81))); !ok {
		t.Error("the damaged cache of a changed file was not replaced by its new content's")
	}
}

// TestBrokenFileKeepsItsObjectsAcrossRestarts: a file broken while the
// agent was down keeps the objects of its last good content, from the parse
// cache, as it would at runtime; health says so and names the file.
func TestBrokenFileKeepsItsObjectsAcrossRestarts(t *testing.T) {
	dir, run := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), servicesFile("a", 2, 80))
	writeFile(t, filepath.Join(dir, "b.yaml"), servicesFile("b", 1, 80))
	if ports := servicePorts(t, dir, run); len(ports) != 3 {
		t.Fatalf("first start: services %v, want 3", ports)
	}

	writeFile(t, filepath.Join(dir, "a.yaml"), []byte("apiVersion: v1\nkind: Service\nmetadata: {name: [broken\n"))
	ports := servicePorts(t, dir, run)
	for _, name := range []string{"a-0", "a-1", "b-0"} {
		if ports[name] != 80 {
			t.Errorf("after a restart with a.yaml broken, services = %v, want a-0, a-1 (last good) and b-0 on port 80", ports)
			break
		}
	}

	// Mended, the file is read again.
	writeFile(t, filepath.Join(dir, "a.yaml"), servicesFile("a", 1, 90))
	ports = servicePorts(t, dir, run)
	if len(ports) != 2 || ports["a-0"] != 90 || ports["b-0"] != 80 {
		t.Errorf("after mending a.yaml, services = %v, want a-0 on 90 and b-0 on 80", ports)
	}
}

// A cache whose object does not hash to its record's digest (the payload
// damaged in place) is not used: the file is parsed, and its objects are
// those of its content.
func TestParseCacheDamagedPayload(t *testing.T) {
	dir, run := t.TempDir(), t.TempDir()
	a := servicesFile("a", 1, 80)
	writeFile(t, filepath.Join(dir, "a.yaml"), a)
	cache := &parseCache{dir: filepath.Join(run, "state", "k8s-manifests")}
	if ports := servicePorts(t, dir, run); ports["a-0"] != 80 {
		t.Fatalf("first start: services %v, want a-0 on port 80", ports)
	}
	if _, ok := cache.load("a.yaml", contentDigest(a)); !ok {
		t.Fatal("no cache of a.yaml after the first start")
	}
	data, err := os.ReadFile(cache.path("a.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// The port, 80, is in the payload as a varint byte 0x50: make it 81.
	i := bytes.LastIndexByte(data, 80)
	if i < 0 {
		t.Fatal("port 80 not found in the cache")
	}
	data[i] = 81
	if err := os.WriteFile(cache.path("a.yaml"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok := cache.load("a.yaml", contentDigest(a)); ok {
		t.Fatal("a cache whose payload does not match its digest was loaded")
	}
	if ports := servicePorts(t, dir, run); ports["a-0"] != 80 {
		t.Errorf("restart on a damaged cache: services %v, want a-0 on port 80 from the file", ports)
	}
}

// TestParseCacheCutOrExtended: a cache file cut at any byte, a record's end
// included, or with bytes after its last record, is not used (a file is
// written whole, by rename, so this is damage, and parsing costs only time).
func TestParseCacheCutOrExtended(t *testing.T) {
	dir, run := t.TempDir(), t.TempDir()
	a := servicesFile("a", 3, 80)
	writeFile(t, filepath.Join(dir, "a.yaml"), a)
	cache := &parseCache{dir: filepath.Join(run, "state", "k8s-manifests")}
	if ports := servicePorts(t, dir, run); len(ports) != 3 {
		t.Fatalf("first start: services %v, want 3", ports)
	}
	whole, err := os.ReadFile(cache.path("a.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, ok := cache.load("a.yaml", contentDigest(a))
	if !ok || len(objs) != 3 {
		t.Fatalf("whole cache: %d objects, loaded %v; want 3", len(objs), ok)
	}
	try := func(what string, data []byte) {
		t.Helper()
		if err := os.WriteFile(cache.path("a.yaml"), data, 0o600); err != nil {
			t.Fatal(err)
		}
		if objs, ok := cache.load("a.yaml", contentDigest(a)); ok {
			t.Fatalf("%s: loaded %d objects", what, len(objs))
		}
	}
	for n := range len(whole) {
		try(fmt.Sprintf("cut to %d of %d bytes", n, len(whole)), whole[:n])
	}
	try("a byte after the last record", append(bytes.Clone(whole), 0))
	try("its last quarter again", append(bytes.Clone(whole), whole[len(whole)-len(whole)/4:]...))
}

// A record whose line or document number does not fit a manifest's 32 bits
// is refused, as a damaged one is; the largest that fits is read.
func TestCacheRecordPositionRange(t *testing.T) {
	record := func(line, doc uint64) []byte {
		var b []byte
		for _, s := range []string{"", "v1", "services", "Service", "default", "web"} {
			b = binary.AppendUvarint(b, uint64(len(s)))
			b = append(b, s...)
		}
		b = binary.AppendUvarint(b, line)
		b = binary.AppendUvarint(b, doc)
		b = binary.LittleEndian.AppendUint64(b, 7)
		return binary.AppendUvarint(b, 0) // an empty encoding
	}
	for _, c := range []struct {
		line, doc uint64
		ok        bool
	}{
		{1, 1, true},
		{math.MaxInt32, math.MaxInt32, true},
		{math.MaxInt32 + 1, 1, false},
		{1, math.MaxInt32 + 1, false},
	} {
		r := &cacheReader{data: record(c.line, c.doc), strs: map[string]string{}}
		rec, _, err := r.next()
		if c.ok && (err != nil || uint64(rec.Line) != c.line || uint64(rec.Doc) != c.doc) {
			t.Errorf("line %d document %d: read %+v, %v", c.line, c.doc, rec, err)
		}
		if !c.ok && !errors.Is(err, errCacheTruncated) {
			t.Errorf("line %d document %d: read %+v, %v; want it refused", c.line, c.doc, rec, err)
		}
	}
}
