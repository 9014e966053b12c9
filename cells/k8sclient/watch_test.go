package k8sclient

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/internal/celltest"
)

// startEmbedded starts the k8s-client cell on dir and returns its Clientset.
func startEmbedded(tb testing.TB, log *slog.Logger, dir string) Clientset {
	tb.Helper()
	var cs Clientset
	h := embeddedHive(tb, dir, cell.Invoke(func(c Clientset) { cs = c }))
	if err := h.Start(log, context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := h.Stop(log, context.Background()); err != nil {
			tb.Error(err)
		}
	})
	return cs
}

// embeddedHive is the k8s-client cell in embedded mode on dir.
func embeddedHive(tb testing.TB, dir string, cells ...cell.Cell) *hive.Hive {
	return embeddedHiveIn(tb, dir, tb.TempDir(), cells...)
}

// embeddedHiveIn is embeddedHive with its state and run directories in run,
// for a test that restarts the cell on the same state.
func embeddedHiveIn(tb testing.TB, dir, run string, cells ...cell.Cell) *hive.Hive {
	h := celltest.New(append([]cell.Cell{daemon.Cell, Cell}, cells...)...)
	hive.AddConfigOverride(h, func(c *daemon.Config) {
		c.StateDir, c.RunDir, c.NodeName = filepath.Join(run, "state"), filepath.Join(run, "run"), "node-1"
	})
	hive.AddConfigOverride(h, func(c *Config) { c.K8sManifestsDir = dir })
	return h
}

// quiet is the benchmarks' logger: every hook logs at Info.
var quiet = slog.New(slog.DiscardHandler)

// servicesFile is a manifest of n Services named prefix-<i>, all with port.
func servicesFile(prefix string, n, port int) []byte {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Service\nmetadata: {name: %s-%d}\nspec:\n  ports: [{port: %d, protocol: TCP}]\n", prefix, i, port)
	}
	return []byte(b.String())
}

// writeFile replaces a file by renaming a new one over it.
func writeFile(tb testing.TB, path string, data []byte) {
	tb.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		tb.Fatal(err)
	}
}

// nextEvent returns the watch's next event, failing after a bound well
// below resyncInterval: a change must be seen through inotify, not found
// by the periodic resync.
func nextEvent(tb testing.TB, w watch.Interface) watch.Event {
	tb.Helper()
	select {
	case ev := <-w.ResultChan():
		return ev
	case <-time.After(resyncInterval / 2):
		tb.Fatalf("no event within %v", resyncInterval/2)
		return watch.Event{}
	}
}

func TestEditSeenThroughInotify(t *testing.T) {
	dir := t.TempDir()
	cs := startEmbedded(t, hivetest.Logger(t), dir)
	list, err := cs.CoreV1().Services("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().Services("").Watch(context.Background(), metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	writeFile(t, filepath.Join(dir, "web.yaml"), servicesFile("web", 1, 80))
	if ev := nextEvent(t, w); ev.Type != watch.Added {
		t.Fatalf("event %s, want ADDED", ev.Type)
	}
	if err := os.Remove(filepath.Join(dir, "web.yaml")); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, w); ev.Type != watch.Deleted {
		t.Fatalf("event %s, want DELETED", ev.Type)
	}
}

// BenchmarkInitialLoad measures the start hook's load of a directory of
// 10 files of 500 Services each.
func BenchmarkInitialLoad(b *testing.B) {
	dir := b.TempDir()
	const files, perFile = 10, 500
	for i := range files {
		writeFile(b, filepath.Join(dir, fmt.Sprintf("svc-%d.yaml", i)), servicesFile(fmt.Sprintf("svc%d", i), perFile, 80))
	}
	start := time.Now()
	for b.Loop() {
		h := embeddedHive(b, dir)
		if err := h.Start(quiet, context.Background()); err != nil {
			b.Fatal(err)
		}
		if err := h.Stop(quiet, context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(files*perFile*b.N)/time.Since(start).Seconds(), "objects/s")
}

// BenchmarkEditToEvent measures how long a watcher waits for an edit of
// one of 10 files of 500 Services: debouncing, reading and decoding every
// file, and writing the one changed object.
func BenchmarkEditToEvent(b *testing.B) {
	dir := b.TempDir()
	const files, perFile = 10, 500
	for i := range files {
		writeFile(b, filepath.Join(dir, fmt.Sprintf("svc-%d.yaml", i)), servicesFile(fmt.Sprintf("svc%d", i), perFile, 80))
	}
	cs := startEmbedded(b, quiet, dir)
	list, err := cs.CoreV1().Services("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	w, err := cs.CoreV1().Services("").Watch(context.Background(), metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	var total time.Duration
	for i := 0; b.Loop(); i++ {
		// The first object of svc-0.yaml changes port on every edit.
		data := append(servicesFile("svc0", 1, 1000+i%2), servicesFile("svc0", perFile, 80)[len(servicesFile("svc0", 1, 80)):]...)
		start := time.Now()
		writeFile(b, filepath.Join(dir, "svc-0.yaml"), data)
		if ev := nextEvent(b, w); ev.Type != watch.Modified {
			b.Fatalf("event %s, want MODIFIED", ev.Type)
		}
		total += time.Since(start)
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/edit")
}
