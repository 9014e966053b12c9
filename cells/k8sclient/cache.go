package k8sclient

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/cespare/xxhash/v2"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/cellium/cellium/pkg/statefile"
)

// parseCache keeps the objects of each manifest file's last decoded
// content in the state directory, in their protobuf encoding, so that a
// restart reads a file of unchanged content without parsing its YAML again:
// YAML was most of the time a large directory took to load, and a protobuf
// object decodes an order of magnitude faster. A cache entry is used only
// when it was made from exactly the content the file has now (its SHA-256
// prefix, the k8s-manifests table's digest), so an edit made while the
// agent was down is always parsed. A cache file that is unreadable, of
// another format or damaged is parsed around and replaced; the cache is
// never the only copy of anything.
type parseCache struct {
	dir string
}

// cacheMagic starts every cache file; another format is ignored (v2's
// records had JSON headers: decoding 100,000 of them was a tenth of a
// restart's CPU).
const cacheMagic = "cellium-manifests-cache-v3\n"

// cacheRecord is the header of one object in a cache file. A file is the
// magic, the digest of the content and a newline, the number of records (a
// uvarint), then the records, so that a file cut short is refused even
// where a record ends. A record is group, version, resource, kind,
// namespace and name, each a uvarint length and its bytes; line and
// document, uvarints; the digest, 8 bytes little endian; then the object's
// encoding, a uvarint length and its bytes.
type cacheRecord struct {
	Group, Version, Resource, Kind string
	Namespace, Name                string
	Line, Doc                      int32
	Digest                         uint64
}

func (rec *cacheRecord) appendTo(b []byte) []byte {
	for _, s := range [...]string{rec.Group, rec.Version, rec.Resource, rec.Kind, rec.Namespace, rec.Name} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = binary.AppendUvarint(b, uint64(rec.Line))
	b = binary.AppendUvarint(b, uint64(rec.Doc))
	return binary.LittleEndian.AppendUint64(b, rec.Digest)
}

// cacheReader reads the records of a cache file held in memory.
type cacheReader struct {
	data []byte
	// strs interns the strings every record repeats (group, version,
	// resource, kind, namespace) for the file.
	strs map[string]string
}

var errCacheTruncated = errors.New("truncated record")

func (r *cacheReader) uvarint() (uint64, error) {
	v, n := binary.Uvarint(r.data)
	if n <= 0 {
		return 0, errCacheTruncated
	}
	r.data = r.data[n:]
	return v, nil
}

// bytes returns the next length-prefixed chunk, still in the file's buffer.
func (r *cacheReader) bytes() ([]byte, error) {
	n, err := r.uvarint()
	if err != nil {
		return nil, err
	}
	if n > uint64(len(r.data)) {
		return nil, errCacheTruncated
	}
	b := r.data[:n:n]
	r.data = r.data[n:]
	return b, nil
}

func (r *cacheReader) str(intern bool) (string, error) {
	b, err := r.bytes()
	if err != nil || !intern {
		return string(b), err
	}
	if s, ok := r.strs[string(b)]; ok {
		return s, nil
	}
	s := string(b)
	r.strs[s] = s
	return s, nil
}

// next reads a record and a copy of its encoding; io.EOF at the end.
func (r *cacheReader) next() (cacheRecord, []byte, error) {
	var rec cacheRecord
	if len(r.data) == 0 {
		return rec, nil, io.EOF
	}
	var err error
	for _, f := range [...]struct {
		dst    *string
		intern bool
	}{{&rec.Group, true}, {&rec.Version, true}, {&rec.Resource, true}, {&rec.Kind, true}, {&rec.Namespace, true}, {&rec.Name, false}} {
		if *f.dst, err = r.str(f.intern); err != nil {
			return rec, nil, err
		}
	}
	line, err := r.uvarint()
	if err != nil {
		return rec, nil, err
	}
	doc, err := r.uvarint()
	if err != nil {
		return rec, nil, err
	}
	if line > math.MaxInt32 || doc > math.MaxInt32 || len(r.data) < 8 {
		return rec, nil, errCacheTruncated
	}
	rec.Line, rec.Doc = int32(line), int32(doc)
	rec.Digest = binary.LittleEndian.Uint64(r.data)
	r.data = r.data[8:]
	encoded, err := r.bytes()
	if err != nil {
		return rec, nil, err
	}
	// A copy: the store keeps it for as long as the object lives, which
	// must not keep the whole file's buffer.
	return rec, bytes.Clone(encoded), nil
}

func (c *parseCache) path(file string) string { return filepath.Join(c.dir, file+".cache") }

// load returns the objects cached for file if they were decoded from the
// content with digest, and false otherwise.
func (c *parseCache) load(file, digest string) ([]decoded, bool) {
	return c.read(file, func(cached string) bool { return cached == digest })
}

// lastGood returns the objects of the last content of file that decoded,
// whatever the file holds now: what a file that is broken at start keeps.
func (c *parseCache) lastGood(file string) ([]decoded, bool) {
	return c.read(file, func(string) bool { return true })
}

// read returns the cached objects of file if the digest of the content they
// were decoded from is one that want accepts.
func (c *parseCache) read(file string, want func(digest string) bool) ([]decoded, bool) {
	data, err := os.ReadFile(c.path(file))
	if err != nil || !bytes.HasPrefix(data, []byte(cacheMagic)) {
		return nil, false
	}
	digest, rest, ok := bytes.Cut(data[len(cacheMagic):], []byte("\n"))
	if !ok || !want(string(digest)) {
		return nil, false
	}
	r := &cacheReader{data: rest, strs: map[string]string{}}
	count, err := r.uvarint()
	if err != nil || count > uint64(len(rest)) {
		return nil, false
	}
	objs := make([]decoded, 0, count)
	for {
		rec, encoded, err := r.next()
		if errors.Is(err, io.EOF) && uint64(len(objs)) == count {
			return objs, true
		}
		if err != nil {
			return nil, false
		}
		m, err := rec.manifest(&file, encoded)
		if err != nil {
			return nil, false
		}
		objs = append(objs, m)
	}
}

// manifest is a cached object. Its encoding is kept as it is, not decoded:
// the embedded server stores that same encoding. It must hash to the
// record's digest, which the encoding was hashed to when the file was
// decoded: a damaged cache is parsed around.
func (rec cacheRecord) manifest(file *string, encoded []byte) (decoded, error) {
	if xxhash.Sum64(encoded) != rec.Digest {
		return decoded{}, fmt.Errorf("cached %s %s/%s does not match its digest", rec.Kind, rec.Namespace, rec.Name)
	}
	return decoded{encoded: encoded, manifest: &manifest{
		key: objectKey{
			objectType: typeOf(schema.GroupVersionResource{Group: rec.Group, Version: rec.Version, Resource: rec.Resource}, rec.Kind),
			namespace:  rec.Namespace,
			name:       rec.Name,
		},
		digest: rec.Digest,
		file:   file,
		line:   rec.Line,
		doc:    rec.Doc,
	}}, nil
}

// store replaces the cache of file with objs, decoded from the content
// with digest and not yet written (they hold their encoding).
func (c *parseCache) store(file, digest string, objs []decoded) error {
	var buf bytes.Buffer
	var record []byte
	buf.WriteString(cacheMagic + digest + "\n")
	buf.Write(binary.AppendUvarint(nil, uint64(len(objs))))
	for _, m := range objs {
		encoded := m.encoded
		if encoded == nil {
			return fmt.Errorf("%s: %s has no encoding to cache", file, m.key)
		}
		rec := cacheRecord{
			Group: m.key.resource.Group, Version: m.key.resource.Version, Resource: m.key.resource.Resource,
			Kind: m.key.kind, Namespace: m.key.namespace, Name: m.key.name,
			Line: m.line, Doc: m.doc, Digest: m.digest,
		}
		record = rec.appendTo(record[:0])
		record = binary.AppendUvarint(record, uint64(len(encoded)))
		buf.Write(record)
		buf.Write(encoded)
	}
	if err := statefile.MkdirAll(c.dir); err != nil {
		return err
	}
	return statefile.Write(c.path(file), buf.Bytes())
}

// prune removes the cache files of files no longer in the directory, and
// temporary files a crash left.
func (c *parseCache) prune(present map[string]bool) error {
	entries, err := os.ReadDir(c.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		file, ok := strings.CutSuffix(e.Name(), ".cache")
		if ok && present[file] {
			continue
		}
		if err := os.Remove(filepath.Join(c.dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
