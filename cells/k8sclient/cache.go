package k8sclient

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
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

// cacheMagic starts every cache file; another format is ignored.
const cacheMagic = "cellium-manifests-cache-v2\n"

// cacheRecord is the header of one object in a cache file.
type cacheRecord struct {
	Group     string `json:"g,omitempty"`
	Version   string `json:"v"`
	Resource  string `json:"r"`
	Kind      string `json:"k"`
	Namespace string `json:"ns,omitempty"`
	Name      string `json:"n"`
	Line      int    `json:"l"`
	Doc       int    `json:"d"`
	Digest    uint64 `json:"h"`
}

func (c *parseCache) path(file string) string { return filepath.Join(c.dir, file+".cache") }

// load returns the objects cached for file if they were decoded from the
// content with digest, and false otherwise.
func (c *parseCache) load(file, digest string) ([]*manifest, bool) {
	return c.read(file, func(cached string) bool { return cached == digest })
}

// lastGood returns the objects of the last content of file that decoded,
// whatever the file holds now: what a file that is broken at start keeps.
func (c *parseCache) lastGood(file string) ([]*manifest, bool) {
	return c.read(file, func(string) bool { return true })
}

// read returns the cached objects of file if the digest of the content they
// were decoded from is one that want accepts.
func (c *parseCache) read(file string, want func(digest string) bool) ([]*manifest, bool) {
	data, err := os.ReadFile(c.path(file))
	if err != nil || !bytes.HasPrefix(data, []byte(cacheMagic)) {
		return nil, false
	}
	digest, rest, ok := bytes.Cut(data[len(cacheMagic):], []byte("\n"))
	if !ok || !want(string(digest)) {
		return nil, false
	}
	r := bufio.NewReader(bytes.NewReader(rest))
	var objs []*manifest
	for {
		rec, encoded, err := readCacheRecord(r)
		if errors.Is(err, io.EOF) {
			return objs, true
		}
		if err != nil {
			return nil, false
		}
		m, err := rec.manifest(file, encoded)
		if err != nil {
			return nil, false
		}
		objs = append(objs, m)
	}
}

func readCacheRecord(r *bufio.Reader) (cacheRecord, []byte, error) {
	var rec cacheRecord
	header, err := readChunk(r)
	if err != nil {
		return rec, nil, err
	}
	if err := json.Unmarshal(header, &rec); err != nil {
		return rec, nil, err
	}
	encoded, err := readChunk(r)
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return rec, encoded, err
}

func readChunk(r *bufio.Reader) ([]byte, error) {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return nil, err
	}
	// No object comes near this; a damaged length must not allocate it.
	if n > 1<<26 {
		return nil, fmt.Errorf("chunk of %d bytes", n)
	}
	chunk := make([]byte, n)
	_, err = io.ReadFull(r, chunk)
	return chunk, err
}

// manifest is a cached object. Its encoding is kept as it is, not decoded:
// the embedded server stores that same encoding. It must hash to the
// record's digest, which the encoding was hashed to when the file was
// decoded: a damaged cache is parsed around.
func (rec cacheRecord) manifest(file string, encoded []byte) (*manifest, error) {
	if xxhash.Sum64(encoded) != rec.Digest {
		return nil, fmt.Errorf("cached %s %s/%s does not match its digest", rec.Kind, rec.Namespace, rec.Name)
	}
	return &manifest{
		key: objectKey{
			objectType: typeOf(schema.GroupVersionResource{Group: rec.Group, Version: rec.Version, Resource: rec.Resource}, rec.Kind),
			namespace:  rec.Namespace,
			name:       rec.Name,
		},
		encoded: encoded,
		digest:  rec.Digest,
		file:    file,
		line:    rec.Line,
		doc:     rec.Doc,
	}, nil
}

// store replaces the cache of file with objs, decoded from the content
// with digest and not yet written (they hold their encoding).
func (c *parseCache) store(file, digest string, objs []*manifest) error {
	var buf bytes.Buffer
	buf.WriteString(cacheMagic + digest + "\n")
	for _, m := range objs {
		encoded := m.encoded
		if encoded == nil {
			return fmt.Errorf("%s: %s has no encoding to cache", file, m.key)
		}
		header, err := json.Marshal(cacheRecord{
			Group: m.key.resource.Group, Version: m.key.resource.Version, Resource: m.key.resource.Resource,
			Kind: m.key.kind, Namespace: m.key.namespace, Name: m.key.name,
			Line: m.line, Doc: m.doc, Digest: m.digest,
		})
		if err != nil {
			return err
		}
		buf.Write(binary.AppendUvarint(nil, uint64(len(header))))
		buf.Write(header)
		buf.Write(binary.AppendUvarint(nil, uint64(len(encoded))))
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
