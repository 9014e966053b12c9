package k8sclient

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/fsnotify/fsnotify"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/cellium/cellium/pkg/kubeclient"
)

// manifestSync keeps the embedded API server's objects equal to the
// manifests directory. Each pass is level-triggered: it reads every file,
// works out the objects they define together, and writes only the
// difference from what it wrote before. Objects other cells create are not
// its business, and an object it wrote is written again only when its
// manifest changes, so other cells' edits (the Node's annotations, say)
// last until then.
type manifestSync struct {
	log    *slog.Logger
	health cell.Health
	dir    string
	// required is set when the directory was given explicitly: then a
	// missing directory is an error, not an empty one.
	required bool
	// localNode is the name of the Node added when no manifest defines it.
	localNode string
	clientset *Fake
	// store is the embedded server's store, which the initial load writes
	// straight into.
	store   *objectStore
	decoder *decoder
	cache   *parseCache
	db      *statedb.DB
	files   statedb.RWTable[*ManifestFile]

	watcher *fsnotify.Watcher
	// watchErr is why the directory could not be watched, as last logged.
	watchErr string

	// loaded holds, per file, the objects last applied from it: what a
	// broken file keeps contributing until it parses again.
	loaded map[string][]*manifest
	// applied is what the passes have written into the fake.
	applied objectSet
	// logged is the error last logged per file, so a broken file is logged
	// once, not on every pass.
	logged map[string]string
	// decoded is each file's content last decoded: a pass decodes only the
	// files whose content changed.
	decoded map[string]*decodedFile
	// encodings are the encodings of the objects a pass decoded (or read
	// from the parse cache), until it writes them; a pass drops the rest
	// at its end.
	encodings map[*manifest][]byte
	// initialLoad is set during the start hook's pass: no other cell has
	// started, so nobody lists or watches yet, and objects go straight into
	// the store (see write).
	initialLoad bool
}

// manifestFileExts are the file names read; others (editor swap files,
// backups, README) are not manifests.
var manifestFileExts = []string{".yaml", ".yml", ".json"}

// isManifestFile says whether a directory entry is read as a manifest file.
// Hidden names are skipped: editors' temporary files and the "..data" and
// "..<timestamp>" entries of a mounted ConfigMap start with a dot.
func isManifestFile(name string) bool {
	return !strings.HasPrefix(name, ".") && slices.Contains(manifestFileExts, filepath.Ext(name))
}

// contentDigest identifies a file's content in the k8s-manifests table.
func contentDigest(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8])
}

func (s *manifestSync) start(cell.HookContext) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch --k8s-manifests-dir: %w", err)
	}
	s.watcher = w
	// Watch before the first read, so no change falls between the two.
	s.ensureWatched()
	s.initialLoad = true
	err = s.sync()
	s.initialLoad = false
	if err != nil {
		w.Close()
		return fmt.Errorf("--k8s-manifests-dir: %w", err)
	}
	return nil
}

func (s *manifestSync) stop(cell.HookContext) error {
	return s.watcher.Close()
}

// ensureWatched watches the directory if it exists and is not watched: at
// start, and again when it was removed and created anew.
func (s *manifestSync) ensureWatched() {
	if slices.Contains(s.watcher.WatchList(), s.dir) {
		return
	}
	err := s.watcher.Add(s.dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) && err.Error() != s.watchErr {
		s.log.Warn("Cannot watch the manifests directory; changes are picked up by the periodic resync only",
			"dir", s.dir, "error", err)
		s.watchErr = err.Error()
	}
}

// fileState is one file's part in a pass.
type fileState struct {
	name   string
	digest string
	// objects are what the file contributes after the pass.
	objects []*manifest
	// fresh is set when objects come from the content just read, rather
	// than from the last good content.
	fresh bool
	err   error
}

// sync is one pass. It returns an error only when the directory cannot be
// read, in which case nothing changes; broken files are reported through
// health and the k8s-manifests table.
func (s *manifestSync) sync() error {
	files, err := s.readFiles()
	if err != nil {
		s.health.Degraded("Cannot read the manifests directory; objects are unchanged", err)
		return err
	}
	s.resolveConflicts(files)

	desired := newObjectSet()
	var order []*manifest
	for _, f := range files {
		for _, m := range f.objects {
			desired.set(m)
			order = append(order, m)
		}
	}
	if node := s.localNodeManifest(); desired.get(node.key) == nil {
		desired.set(node)
		order = append(order, node)
	}
	writeErrs := s.apply(desired, order)
	// The encodings of objects not written (unchanged, or their write
	// failed) are not kept: a later write decodes its file again.
	s.encodings = nil

	s.loaded = map[string][]*manifest{}
	var fileErrs []string
	for _, f := range files {
		s.loaded[f.name] = f.objects
		if f.err != nil {
			fileErrs = append(fileErrs, f.err.Error())
		}
	}
	s.logFileErrors(files)
	s.writeTable(files)
	present := map[string]bool{}
	for _, f := range files {
		present[f.name] = true
	}
	if err := s.cache.prune(present); err != nil {
		s.log.Warn("Cannot remove the parse cache of removed manifest files", "dir", s.cache.dir, "error", err)
	}
	// Nothing else reads the fake's record of the calls made to it; left
	// alone it would grow for as long as the agent runs.
	s.clientset.ClearActions()

	switch {
	case len(fileErrs) > 0:
		s.health.Degraded(
			fmt.Sprintf("%d of %d manifest files not applied; their objects are as before", len(fileErrs), len(files)),
			errors.New(strings.Join(fileErrs, "; ")))
	case len(writeErrs) > 0:
		s.health.Degraded("Objects not written to the embedded API server", errors.Join(writeErrs...))
	default:
		s.health.OK(fmt.Sprintf("%d objects from %d files", desired.len(), len(files)))
	}
	return nil
}

// readFiles reads and decodes every manifest file of the directory, in name
// order. A file that cannot be read or decoded keeps its last good objects.
// Decoding is most of a pass, so only changed files are decoded.
func (s *manifestSync) readFiles() ([]*fileState, error) {
	entries, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) && !s.required {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	s.ensureWatched()
	var files []*fileState
	decoded := map[string]*decodedFile{}
	var toDecode []fileToDecode
	for _, e := range entries {
		if !isManifestFile(e.Name()) {
			continue
		}
		f := &fileState{name: e.Name()}
		path := filepath.Join(s.dir, e.Name())
		// Stat follows symlinks: a ConfigMap's keys are symlinks into
		// "..data".
		if fi, err := os.Stat(path); err == nil && !fi.Mode().IsRegular() {
			continue
		}
		data, err := os.ReadFile(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue // removed since the listing
		case err != nil:
			f.objects, f.err = s.lastGood(f.name), &fileError{file: f.name, msg: err.Error()}
		default:
			f.digest = contentDigest(data)
			d, ok := s.decoded[f.name]
			if !ok || d.digest != f.digest {
				d = &decodedFile{}
				toDecode = append(toDecode, fileToDecode{name: f.name, digest: f.digest, data: data, out: d})
			}
			decoded[f.name] = d
		}
		files = append(files, f)
	}
	s.decodeFiles(toDecode)
	for _, f := range toDecode {
		f.out.objects, f.out.fresh = s.keep(f.out.fresh), nil
	}
	for _, f := range files {
		d := decoded[f.name]
		switch {
		case d == nil: // not read
		case d.err != nil:
			f.objects, f.err = s.lastGood(f.name), d.err
		default:
			f.objects, f.fresh = d.objects, true
		}
	}
	s.decoded = decoded
	return files, nil
}

// lastGood is what a file that cannot be applied keeps: its objects of the
// last pass or, in the first pass after a restart, those of its last
// content that decoded, from the parse cache. So a file broken while the
// agent was down does not take its Services away with it.
func (s *manifestSync) lastGood(name string) []*manifest {
	if objs, ok := s.loaded[name]; ok {
		return objs
	}
	objs, _ := s.cache.lastGood(name)
	return s.keep(objs)
}

// keep holds the encodings of objs until a write takes them, and returns
// their manifests.
func (s *manifestSync) keep(objs []decoded) []*manifest {
	if len(objs) == 0 {
		return nil
	}
	if s.encodings == nil {
		s.encodings = map[*manifest][]byte{}
	}
	out := make([]*manifest, len(objs))
	for i, o := range objs {
		s.encodings[o.manifest] = o.encoded
		out[i] = o.manifest
	}
	return out
}

// resolveConflicts makes every object come from one file. When files
// define the same object, one keeps it: a file that is not fresh (its
// objects cannot change), else the file it was applied from, else the first
// by name. Another file is then an error and falls back to its last good
// objects. Last good objects never overlap (they are the outcome of the
// previous pass), so at most one definer is not fresh, the loser always is,
// and each round turns one fresh file stale: this ends. An object that
// moves from one file to another in one pass has a single definer and
// simply changes file.
func (s *manifestSync) resolveConflicts(files []*fileState) {
	for {
		definers := map[objectKey][]*fileState{}
		for _, f := range files {
			for _, m := range f.objects {
				definers[m.key] = append(definers[m.key], f)
			}
		}
		// Settle the conflicts in a fixed order: which file loses one
		// conflict can decide another.
		var contested []objectKey
		for key, defs := range definers {
			if len(defs) > 1 {
				contested = append(contested, key)
			}
		}
		if len(contested) == 0 {
			return
		}
		key := slices.MinFunc(contested, func(a, b objectKey) int { return cmp.Compare(a.String(), b.String()) })
		defs := definers[key]
		keeper := defs[0]
		if i := slices.IndexFunc(defs, func(f *fileState) bool { return !f.fresh }); i >= 0 {
			keeper = defs[i]
		} else if prev := s.applied.get(key); prev != nil {
			if i := slices.IndexFunc(defs, func(f *fileState) bool { return f.name == *prev.file }); i >= 0 {
				keeper = defs[i]
			}
		}
		loser := defs[slices.IndexFunc(defs, func(f *fileState) bool { return f != keeper })]
		m, kept := loser.definition(key), keeper.definition(key)
		loser.err = &fileError{loser.name, int(m.line), int(m.doc),
			fmt.Sprintf("%s is already defined in %s:%d", key, *kept.file, kept.line)}
		if loser.fresh {
			// What it applied before in this run: its cached parse
			// may be this very content, which conflicts.
			loser.objects, loser.fresh = s.loaded[loser.name], false
		} else {
			// Two files' last good objects overlap, which only the
			// cache's can (an object moved between files while the
			// agent was down, and both are broken now): the keeper's
			// stands, and the loser no longer defines it.
			loser.objects = slices.DeleteFunc(slices.Clone(loser.objects), func(m *manifest) bool { return m.key == key })
		}
	}
}

func (f *fileState) definition(key objectKey) *manifest {
	return f.objects[slices.IndexFunc(f.objects, func(m *manifest) bool { return m.key == key })]
}

// localNodeManifest is the Node that a kubelet would have registered: the
// agent's own node, with the labels every kubelet sets. A manifest of the
// same Node replaces it (and a pod CIDR comes only from there, or from
// --pod-cidr).
func (s *manifestSync) localNodeManifest() *manifest {
	node := &corev1.Node{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{
			Name: s.localNode,
			Labels: map[string]string{
				corev1.LabelHostname:   s.localNode,
				corev1.LabelOSStable:   goruntime.GOOS,
				corev1.LabelArchStable: goruntime.GOARCH,
			},
		},
	}
	m := decoded{manifest: &manifest{
		key: objectKey{
			objectType: typeOf(corev1.SchemeGroupVersion.WithResource("nodes"), "Node"),
			name:       s.localNode,
		},
		file: new(string),
	}}
	// A Node always encodes.
	m.setObject(node)
	return s.keep([]decoded{m})[0]
}

// apply writes the difference between desired and what was applied: new
// objects, changed ones (compared with the manifest last written, not with
// the fake's copy, which other cells may have annotated), and deletions.
// order is desired in file order, for a readable sequence of events.
func (s *manifestSync) apply(desired objectSet, order []*manifest) []error {
	var errs []error
	var created, updated, deleted int
	for _, m := range order {
		prev := s.applied.get(m.key)
		if prev != nil && prev.digest == m.digest {
			s.applied.set(m) // it may have moved to another file
			continue
		}
		if err := s.write(prev == nil, m); err != nil {
			errs = append(errs, fmt.Errorf("write %s: %w", m.key, err))
			continue
		}
		if prev == nil {
			created++
		} else {
			updated++
		}
		s.applied.set(m)
	}
	stale := slices.SortedFunc(func(yield func(objectKey) bool) {
		for m := range s.applied.all() {
			if desired.get(m.key) == nil && !yield(m.key) {
				return
			}
		}
	}, func(a, b objectKey) int { return cmp.Compare(a.String(), b.String()) })
	for _, key := range stale {
		err := s.invoke(kubeclient.Request{Verb: "delete", Resource: key.resource, Namespace: key.namespace, Name: key.name})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete %s: %w", key, err))
			continue
		}
		s.applied.delete(key)
		deleted++
	}
	if created+updated+deleted > 0 {
		s.log.Info("Applied manifests", "dir", s.dir, "created", created, "updated", updated, "deleted", deleted)
	}
	return errs
}

// write creates or updates m's object. The fake may hold objects that
// other clients created or deleted, so either falls back to the other.
// Once written, its encoding is dropped: the embedded server holds it, and
// keeping it for every object of a large directory (a typed object then,
// five times the size) doubled the agent's memory.
func (s *manifestSync) write(create bool, m *manifest) error {
	encoded, err := s.encodingOf(m)
	if err != nil {
		return err
	}
	if s.initialLoad {
		// Straight into the store, encoded as it is: the reactors'
		// serialization and copies are for clients that list and watch,
		// and none has started yet.
		err = s.store.putEncoded(m.key.resource, m.gvk(), m.key.namespace, m.key.name, encoded)
	} else {
		var obj runtime.Object
		if obj, err = decodeEncoded(m.gvk(), encoded); err == nil {
			err = s.invokeWrite(create, m.key, obj)
		}
	}
	if err == nil {
		delete(s.encodings, m)
	}
	return err
}

// invokeWrite creates or updates obj through the fake's reactors, as an API
// client would.
func (s *manifestSync) invokeWrite(create bool, key objectKey, obj runtime.Object) error {
	createReq := kubeclient.Request{Verb: "create", Resource: key.resource, Namespace: key.namespace, Object: obj}
	if create {
		err := s.invoke(createReq)
		if !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	err := s.invoke(kubeclient.Request{Verb: "update", Resource: key.resource, Namespace: key.namespace, Name: key.name, Object: obj})
	if apierrors.IsNotFound(err) {
		return s.invoke(createReq)
	}
	return err
}

// encodingOf is m's object's encoding: kept since it was decoded, or, for
// one written before and now to be written again (it returns after another
// file's definition was written over it), decoded again from its file.
func (s *manifestSync) encodingOf(m *manifest) ([]byte, error) {
	if encoded, ok := s.encodings[m]; ok {
		return encoded, nil
	}
	data, err := os.ReadFile(filepath.Join(s.dir, *m.file))
	if err != nil {
		return nil, err
	}
	objs, err := s.decoder.decodeFile(*m.file, data)
	if err != nil {
		return nil, err
	}
	for _, o := range objs {
		if o.key == m.key && o.digest == m.digest {
			return o.encoded, nil
		}
	}
	return nil, fmt.Errorf("%s changed since it was read: the next pass applies it", *m.file)
}

// invoke sends a write through the fake's reactors as an API call would
// (objects are copies: the fake may keep and modify them). That serializes
// it with other clients' writes and waits for the watches to have room:
// see newFakeClientset.
func (s *manifestSync) invoke(req kubeclient.Request) error {
	_, err := s.clientset.Invoke(req)
	return err
}

func (s *manifestSync) logFileErrors(files []*fileState) {
	present := map[string]bool{}
	for _, f := range files {
		present[f.name] = true
		switch {
		case f.err == nil && s.logged[f.name] != "":
			s.log.Info("Manifest file applied again", "file", f.name)
			delete(s.logged, f.name)
		case f.err != nil && s.logged[f.name] != f.err.Error():
			s.log.Warn("Manifest file not applied; its objects are as before", "file", f.name, "error", f.err)
			s.logged[f.name] = f.err.Error()
		}
	}
	for name := range s.logged {
		if !present[name] {
			delete(s.logged, name)
		}
	}
}

// writeTable makes the k8s-manifests table list the files just read.
func (s *manifestSync) writeTable(files []*fileState) {
	txn := s.db.WriteTxn(s.files)
	defer txn.Abort()
	present := map[string]bool{}
	for _, f := range files {
		present[f.name] = true
		row := &ManifestFile{Name: f.name, Objects: len(f.objects), Digest: f.digest}
		if f.err != nil {
			row.Error = f.err.Error()
		}
		if old, _, found := s.files.Get(txn, ManifestFileName.Query(f.name)); found && *old == *row {
			continue
		}
		s.files.Insert(txn, row)
	}
	var gone []*ManifestFile
	for row := range s.files.All(txn) {
		if !present[row.Name] {
			gone = append(gone, row)
		}
	}
	for _, row := range gone {
		s.files.Delete(txn, row)
	}
	txn.Commit()
}
