package k8sclient

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/pkg/kubeclient"
)

func TestScript(t *testing.T) {
	scripttest.Test(t, context.Background(), newEngine, nil, "testdata/*.txtar")
}

// watchedKind is a kind the test watches with an informer.
type watchedKind struct {
	kind       string
	resource   schema.GroupVersionResource
	namespaced bool
	informer   func(Clientset) cache.SharedIndexInformer
}

// watchedKinds are the kinds the agent's reflectors will watch.
var watchedKinds = []watchedKind{
	{"EndpointSlice", discoveryv1.SchemeGroupVersion.WithResource("endpointslices"), true,
		func(cs Clientset) cache.SharedIndexInformer {
			return NewInformer(cs, cs.DiscoveryV1().EndpointSlices(""), &discoveryv1.EndpointSlice{}, nil)
		}},
	{"Namespace", corev1.SchemeGroupVersion.WithResource("namespaces"), false,
		func(cs Clientset) cache.SharedIndexInformer {
			return NewInformer(cs, cs.CoreV1().Namespaces(), &corev1.Namespace{}, nil)
		}},
	{"Node", corev1.SchemeGroupVersion.WithResource("nodes"), false,
		func(cs Clientset) cache.SharedIndexInformer {
			return NewInformer(cs, cs.CoreV1().Nodes(), &corev1.Node{}, nil)
		}},
	{"Pod", corev1.SchemeGroupVersion.WithResource("pods"), true,
		func(cs Clientset) cache.SharedIndexInformer {
			return NewInformer(cs, cs.CoreV1().Pods(""), &corev1.Pod{}, nil)
		}},
	{"Service", corev1.SchemeGroupVersion.WithResource("services"), true,
		func(cs Clientset) cache.SharedIndexInformer {
			return NewInformer(cs, cs.CoreV1().Services(""), &corev1.Service{}, nil)
		}},
}

// fakeOf is the fake behind an embedded Clientset.
func fakeOf(cs Clientset) *Fake {
	return cs.(embeddedClientset).fake
}

// newEngine runs the k8s-client cell in embedded mode on a temporary
// manifests directory, which the script edits with the manifest/...
// commands, and a module "k8s-watcher" that, like the agent's reflectors,
// starts informers in its start hook and records every event they deliver.
// Flags on the #! line are the cells' flags.
func newEngine(t testing.TB, args []string) *script.Engine {
	dir := t.TempDir()
	events := &eventLog{changed: make(chan struct{})}
	var (
		clientset Clientset
		db        *statedb.DB
		files     statedb.Table[*ManifestFile]
	)
	h := celltest.New(
		daemon.Cell,
		Cell,
		cell.Module("k8s-watcher", "Informers recording the events of the test",
			cell.Invoke(func(lc cell.Lifecycle, cs Clientset, db_ *statedb.DB, files_ statedb.Table[*ManifestFile]) {
				clientset, db, files = cs, db_, files_
				lc.Append(&watcher{clientset: cs, events: events})
			}),
		),
	)
	run := t.TempDir()
	hive.AddConfigOverride(h, func(c *daemon.Config) {
		c.StateDir, c.RunDir, c.NodeName = filepath.Join(run, "state"), filepath.Join(run, "run"), "node-1"
	})
	hive.AddConfigOverride(h, func(c *Config) { c.K8sManifestsDir = dir })

	cs := func() *Fake { return fakeOf(clientset) }
	return celltest.ScriptEngine(t, h, args, map[string]script.Cmd{
		"manifest/write": script.Command(
			script.CmdUsage{
				Summary: "Write a file of the script into the manifests directory",
				Args:    "name [source]",
				Detail: []string{
					"Writes a temporary file and renames it over name, as editors do.",
					"With --in-place, truncates and writes name instead.",
				},
				Flags: func(fs *pflag.FlagSet) { fs.Bool("in-place", false, "truncate and write in place") },
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) < 1 || len(args) > 2 {
					return nil, script.ErrUsage
				}
				src := args[len(args)-1]
				data, err := os.ReadFile(s.Path(src))
				if err != nil {
					return nil, err
				}
				dst := filepath.Join(dir, args[0])
				if inPlace, _ := s.Flags.GetBool("in-place"); inPlace {
					return nil, os.WriteFile(dst, data, 0o644)
				}
				tmp := filepath.Join(dir, "."+args[0]+".swp")
				if err := os.WriteFile(tmp, data, 0o644); err != nil {
					return nil, err
				}
				return nil, os.Rename(tmp, dst)
			}),
		"manifest/rm": script.Command(
			script.CmdUsage{Summary: "Remove a file of the manifests directory", Args: "name"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				return nil, os.Remove(filepath.Join(dir, args[0]))
			}),
		"manifest/mv": script.Command(
			script.CmdUsage{Summary: "Rename a file of the manifests directory", Args: "old new"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 2 {
					return nil, script.ErrUsage
				}
				return nil, os.Rename(filepath.Join(dir, args[0]), filepath.Join(dir, args[1]))
			}),
		"manifest/configmap": script.Command(
			script.CmdUsage{
				Summary: "Publish files of the script as a mounted ConfigMap does",
				Args:    "source...",
				Detail: []string{
					"Follows the kubelet: the files go into a new ..<n> directory, the ..data",
					"symlink is swapped to it by renaming ..data_tmp over it, each file is a",
					"symlink into ..data, files no longer published lose their symlink, and",
					"the previous directory is removed.",
				},
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				return nil, publishConfigMap(dir, s, args)
			}),
		"k8s/events": script.Command(
			script.CmdUsage{
				Summary: "Print the informers' events since the last call, sorted",
				Detail: []string{
					"First waits until the agent has read every manifest file as it is now,",
					"and until every event sent so far has reached the informers.",
					"LIST is an object of an informer's initial list.",
				},
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if err := waitForFiles(s.Context(), db, files, dir); err != nil {
					return nil, err
				}
				if err := events.flush(s.Context(), cs()); err != nil {
					return nil, err
				}
				return stdout(strings.Join(events.take(), "")), nil
			}),
		"k8s/get": script.Command(
			script.CmdUsage{Summary: "Print an object of the embedded API server as YAML", Args: "kind [namespace/]name"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 2 {
					return nil, script.ErrUsage
				}
				i := slices.IndexFunc(watchedKinds, func(k watchedKind) bool { return k.kind == args[0] })
				if i < 0 {
					return nil, fmt.Errorf("unknown kind %q", args[0])
				}
				ns, name, found := strings.Cut(args[1], "/")
				if !found {
					ns, name = "", ns
				}
				obj, err := cs().Invoke(kubeclient.Request{Verb: "get", Resource: watchedKinds[i].resource, Namespace: ns, Name: name})
				if err != nil {
					return nil, err
				}
				out, err := sigsyaml.Marshal(obj)
				return stdout(string(out)), err
			}),
	})
}

func stdout(s string) script.WaitFunc {
	return func(*script.State) (string, string, error) { return s, "", nil }
}

// publishConfigMap replaces the files of dir as the kubelet updates a
// mounted ConfigMap.
func publishConfigMap(dir string, s *script.State, sources []string) error {
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	gen := 1
	for ; ; gen++ {
		if _, err := os.Lstat(filepath.Join(dir, fmt.Sprintf("..%d", gen))); errors.Is(err, os.ErrNotExist) {
			break
		}
	}
	ts := fmt.Sprintf("..%d", gen)
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		return err
	}
	published := map[string]bool{}
	for _, src := range sources {
		data, err := os.ReadFile(s.Path(src))
		if err != nil {
			return err
		}
		name := filepath.Base(src)
		published[name] = true
		if err := os.WriteFile(filepath.Join(dir, ts, name), data, 0o644); err != nil {
			return err
		}
	}
	if err := os.Symlink(ts, filepath.Join(dir, "..data_tmp")); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		return err
	}
	for name := range published {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if target, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil &&
			strings.HasPrefix(target, "..data/") && !published[e.Name()] {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	if old != "" {
		return os.RemoveAll(filepath.Join(dir, old))
	}
	return nil
}

// waitForFiles waits until the k8s-manifests table shows every manifest
// file of dir with the digest of its current content: the agent has then
// finished a pass that read them as they are.
func waitForFiles(ctx context.Context, db *statedb.DB, files statedb.Table[*ManifestFile], dir string) error {
	for {
		want := map[string]string{}
		entries, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if !isManifestFile(e.Name()) {
				continue
			}
			if data, err := os.ReadFile(filepath.Join(dir, e.Name())); err == nil {
				want[e.Name()] = contentDigest(data)
			}
		}
		rows, watch := files.AllWatch(db.ReadTxn())
		got := map[string]string{}
		for row := range rows {
			got[row.Name] = row.Digest
		}
		if fmt.Sprint(got) == fmt.Sprint(want) {
			return nil
		}
		select {
		case <-watch:
		case <-ctx.Done():
			return fmt.Errorf("the agent has not read the manifests as they are: has %v, want %v", got, want)
		}
	}
}

// watcher runs the test's informers from its start hook, after the
// k8s-client cell's: the initial list must already hold every manifest.
type watcher struct {
	clientset Clientset
	events    *eventLog
	factory   *Informers
	stop      chan struct{}
}

func (w *watcher) Start(ctx cell.HookContext) error {
	w.stop = make(chan struct{})
	// Once every informer watches, an object's creation and deletion
	// both reach it; eventLog.flush depends on that.
	var mu sync.Mutex
	watching, allWatching := map[schema.GroupVersionResource]bool{}, make(chan struct{})
	fakeOf(w.clientset).PrependWatchReactor("*", func(a Action) (bool, watch.Interface, error) {
		mu.Lock()
		defer mu.Unlock()
		if !watching[a.Resource] {
			watching[a.Resource] = true
			if len(watching) == len(watchedKinds) {
				close(allWatching)
			}
		}
		return false, nil, nil
	})
	var all []cache.SharedIndexInformer
	var synced []cache.InformerSynced
	for _, k := range watchedKinds {
		inf := k.informer(w.clientset)
		all, synced = append(all, inf), append(synced, inf.HasSynced)
		record := func(event string, obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			key, _ := cache.MetaNamespaceKeyFunc(obj)
			w.events.add(event + " " + k.kind + " " + key + "\n")
		}
		_, err := inf.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
			AddFunc: func(obj any, initial bool) {
				if initial {
					record("LIST", obj)
				} else {
					record("ADDED", obj)
				}
			},
			UpdateFunc: func(_, obj any) { record("MODIFIED", obj) },
			DeleteFunc: func(obj any) { record("DELETED", obj) },
		})
		if err != nil {
			return err
		}
	}
	w.factory = NewInformers(all...)
	w.factory.Start(wait.ContextForChannel(w.stop))
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("informers did not sync: %w", ctx.Err())
	}
	select {
	case <-allWatching:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("informers not watching: %w", ctx.Err())
	}
}

func (w *watcher) Stop(cell.HookContext) error {
	close(w.stop)
	w.factory.Shutdown()
	return nil
}

// flushName names the objects with which eventLog.flush marks the end of
// the events sent so far.
const flushName = "flush-marker"

// eventLog is the events the informers delivered, one line each.
type eventLog struct {
	mu      sync.Mutex
	lines   []string
	changed chan struct{}
}

func (l *eventLog) add(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, line)
	close(l.changed)
	l.changed = make(chan struct{})
}

// flush returns once every event sent before it has reached the informers:
// it deletes a marker object of each kind and waits for the deletion,
// which each watch delivers after everything before it.
func (l *eventLog) flush(ctx context.Context, cs *Fake) error {
	for _, k := range watchedKinds {
		gvk := k.resource.GroupVersion().WithKind(k.kind)
		obj, err := kubeclient.Scheme.New(gvk)
		if err != nil {
			return err
		}
		acc, err := meta.Accessor(obj)
		if err != nil {
			return err
		}
		ns := ""
		if k.namespaced {
			ns = flushName
		}
		acc.SetName(flushName)
		acc.SetNamespace(ns)
		if _, err := cs.Invoke(kubeclient.Request{Verb: "create", Resource: k.resource, Namespace: ns, Object: obj}); err != nil {
			return err
		}
		if _, err := cs.Invoke(kubeclient.Request{Verb: "delete", Resource: k.resource, Namespace: ns, Name: flushName}); err != nil {
			return err
		}
		key := flushName
		if k.namespaced {
			key = flushName + "/" + flushName
		}
		if err := l.waitFor(ctx, "DELETED "+k.kind+" "+key+"\n"); err != nil {
			return err
		}
	}
	return nil
}

func (l *eventLog) waitFor(ctx context.Context, line string) error {
	for {
		l.mu.Lock()
		found, changed := slices.Contains(l.lines, line), l.changed
		l.mu.Unlock()
		if found {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("no event %q", strings.TrimSpace(line))
		}
	}
}

// take returns the events so far, sorted (informers of different kinds
// deliver concurrently), without the flush markers, and forgets them.
func (l *eventLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		if !strings.Contains(line, flushName) {
			out = append(out, line)
		}
	}
	l.lines = nil
	slices.Sort(out)
	return out
}
