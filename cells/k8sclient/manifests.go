package k8sclient

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/cespare/xxhash/v2"
	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/cellium/cellium/pkg/kubeclient"
)

// objectKey identifies an object in the embedded API server. The fake keeps
// each API version apart (it does no conversion), so the version is part of
// the identity. The type is shared by every object of it: a key is kept per
// object of the directory, 100,000 of them for 50,000 Services.
type objectKey struct {
	*objectType
	namespace string
	name      string
}

// objectType is a resource in one API version and its kind.
type objectType struct {
	resource schema.GroupVersionResource
	kind     string
}

// objectTypes interns objectTypes, so that keys of one type compare equal.
var objectTypes sync.Map // objectType -> *objectType

func typeOf(resource schema.GroupVersionResource, kind string) *objectType {
	t := objectType{resource: resource, kind: kind}
	if p, ok := objectTypes.Load(t); ok {
		return p.(*objectType)
	}
	p, _ := objectTypes.LoadOrStore(t, &t)
	return p.(*objectType)
}

func (k objectKey) String() string {
	if k.namespace == "" {
		return k.kind + " " + k.name
	}
	return k.kind + " " + k.namespace + "/" + k.name
}

// manifest is one object of a manifest file, as the passes keep it: one
// per object of the directory, 64 bytes. Its encoding is not kept (see
// decoded).
type manifest struct {
	key objectKey
	// digest is the hash of the object's encoding: what later passes
	// compare with.
	digest uint64
	// file is the file's name, shared by its objects.
	file *string
	// line is where the object's document starts, doc its position among
	// the file's documents (from 1).
	line, doc int32
}

// decoded is a manifest as decoding gives it, with its object's encoding
// (encodeObject's, in which the embedded API server stores it): what the
// pass that writes the object needs, and nothing keeps after. The decoded
// object itself is not kept either: it is five times the size.
type decoded struct {
	*manifest
	encoded []byte
}

// fileError is a manifest file that cannot be applied, and where.
type fileError struct {
	file      string
	line, doc int
	msg       string
}

func (e *fileError) Error() string {
	switch {
	case e.line == 0:
		return fmt.Sprintf("%s: %s", e.file, e.msg)
	case e.doc == 0:
		return fmt.Sprintf("%s:%d: %s", e.file, e.line, e.msg)
	default:
		return fmt.Sprintf("%s:%d: document %d: %s", e.file, e.line, e.doc, e.msg)
	}
}

// decoder turns manifest files into objects with kubeclient.Scheme: the
// built-in kinds of the API groups the agent uses. It is safe for
// concurrent use.
type decoder struct {
	codec  runtime.Decoder
	mapper meta.RESTMapper
	// mappings caches the mapper's answers by kind: it searches every
	// group on each call, which was a tenth of a large directory's load.
	mappings sync.Map // schema.GroupVersionKind -> *meta.RESTMapping
}

func newDecoder() *decoder {
	return &decoder{
		// Strict, as kubectl's server-side field validation is: a misspelt
		// field is an error, not silently dropped.
		codec:  serializer.NewCodecFactory(kubeclient.Scheme, serializer.EnableStrict).UniversalDeserializer(),
		mapper: restMapper(),
	}
}

func (d *decoder) restMapping(gvk schema.GroupVersionKind) (*meta.RESTMapping, error) {
	if m, ok := d.mappings.Load(gvk); ok {
		return m.(*meta.RESTMapping), nil
	}
	m, err := d.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, err
	}
	d.mappings.Store(gvk, m)
	return m, nil
}

// servedVersion is whether apiVersion is one of kubeclient.Scheme's group
// versions: the kinds embedded mode serves.
func servedVersion(apiVersion string) bool {
	for _, gv := range kubeclient.GroupVersions {
		if gv.String() == apiVersion {
			return true
		}
	}
	return false
}

func servedVersions() string {
	var names []string
	for _, gv := range kubeclient.GroupVersions {
		names = append(names, gv.String())
	}
	return strings.Join(names, ", ")
}

// document is one "---"-separated part of a file.
type document struct {
	// index counts the file's non-empty documents from 1.
	index int
	// line is the file line of data's first line; objectLine that of its
	// first line that is not blank or a comment.
	line, objectLine int
	data             []byte
}

// decodeFile returns the objects of a file, or the first error in it.
// Namespaced objects without a namespace get "default", as with kubectl.
func (d *decoder) decodeFile(name string, data []byte) ([]decoded, error) {
	docs, err := splitDocuments(name, data)
	if err != nil {
		return nil, err
	}
	var objs []decoded
	seen := map[objectKey]int{}
	for _, doc := range docs {
		m, err := d.decodeDocument(&name, doc)
		if err != nil {
			return nil, err
		}
		if line, dup := seen[m.key]; dup {
			return nil, &fileError{name, doc.objectLine, doc.index,
				fmt.Sprintf("%s is already defined at line %d of this file", m.key, line)}
		}
		seen[m.key] = doc.objectLine
		objs = append(objs, m)
	}
	return objs, nil
}

// separatorRE is a document separator: "---", optionally followed by a
// comment. kubectl accepts nothing else on that line either.
var separatorRE = regexp.MustCompile(`^---\s*(#.*)?$`)

func splitDocuments(name string, data []byte) ([]document, error) {
	var docs []document
	cur := document{line: 1}
	flush := func() {
		if cur.objectLine != 0 {
			cur.index = len(docs) + 1
			docs = append(docs, cur)
		}
	}
	// A document's data is the part of data between its separators (not a
	// copy), its lines examined without making strings of them.
	lineNo, start, end := 0, 0, 0
	for line := range bytes.Lines(data) {
		lineNo++
		end += len(line)
		if bytes.HasPrefix(line, []byte("---")) {
			text := strings.TrimRight(string(line), "\r\n")
			if !separatorRE.MatchString(text) {
				return nil, &fileError{name, lineNo, 0,
					fmt.Sprintf("invalid document separator %q: put nothing but a comment after ---", text)}
			}
			flush()
			cur = document{line: lineNo + 1}
			start = end
			continue
		}
		if cur.objectLine == 0 {
			if trimmed := bytes.TrimSpace(line); len(trimmed) > 0 && trimmed[0] != '#' {
				cur.objectLine = lineNo
			}
		}
		cur.data = data[start:end:end]
	}
	flush()
	return docs, nil
}

// header is what every object needs before its kind can be decoded.
type header struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
}

func (d *decoder) decodeDocument(file *string, doc document) (decoded, error) {
	fail := func(line int, format string, args ...any) error {
		return &fileError{*file, line, doc.index, fmt.Sprintf(format, args...)}
	}
	// The same conversion as kubectl's, so YAML 1.1 forms such as
	// "enabled: yes" mean what they mean there. Strict: a key given twice
	// is a mistake.
	js, err := sigsyaml.YAMLToJSONStrict(doc.data)
	if err != nil {
		line, msg := yamlErrorLine(err)
		if line == 0 {
			return decoded{}, fail(doc.objectLine, "%s", msg)
		}
		return decoded{}, fail(doc.line+line-1, "%s", msg)
	}
	// at is the file line of a field of the document, for errors about it.
	at := func(path string) int {
		if line := fieldLine(doc.data, path); line > 0 {
			return doc.line + line - 1
		}
		return doc.objectLine
	}
	// The codec finds the kind itself; the header is read apart only to
	// explain an object that does not decode or has no name, which keeps
	// a second pass over every document off the common path.
	obj, gvk, decodeErr := d.codec.Decode(js, nil, nil)
	var h header
	if decodeErr == nil {
		if acc, err := meta.Accessor(obj); err == nil {
			h.APIVersion, h.Kind = gvk.GroupVersion().String(), gvk.Kind
			h.Metadata.Name = acc.GetName()
		}
	}
	if decodeErr != nil || h.Metadata.Name == "" {
		if err := json.Unmarshal(js, &h); err != nil {
			if !bytes.HasPrefix(js, []byte("{")) {
				return decoded{}, fail(doc.objectLine, "not an object: want a mapping with apiVersion, kind and metadata")
			}
			return decoded{}, fail(doc.objectLine, "apiVersion and kind must be strings, metadata a mapping with a name")
		}
	}
	// By convention only list kinds end in "List"; they have no name.
	if strings.HasSuffix(h.Kind, "List") {
		return decoded{}, fail(at("kind"), "kind %s holds several objects: put each in its own --- document", h.Kind)
	}
	var missing []string
	for _, f := range []struct{ name, value string }{{"apiVersion", h.APIVersion}, {"kind", h.Kind}, {"metadata.name", h.Metadata.Name}} {
		if f.value == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return decoded{}, fail(doc.objectLine, "missing %s: every object needs apiVersion, kind and metadata.name", strings.Join(missing, ", "))
	}
	switch {
	case runtime.IsNotRegisteredError(decodeErr) && !servedVersion(h.APIVersion):
		return decoded{}, fail(at("apiVersion"), "%s %s: %s is not served in embedded mode, which serves the API groups the agent reads (%s)",
			h.Kind, h.Metadata.Name, h.APIVersion, servedVersions())
	case runtime.IsNotRegisteredError(decodeErr):
		return decoded{}, fail(at("kind"), "unknown kind %q in %s: not a built-in Kubernetes kind", h.Kind, h.APIVersion)
	case decodeErr != nil:
		return decoded{}, fail(at(decodeErrorPath(decodeErr)), "%s %s: %v", h.Kind, h.Metadata.Name, decodeErr)
	}
	mapping, err := d.restMapping(*gvk)
	if err != nil {
		return decoded{}, fail(at("kind"), "kind %s in %s is not a resource the API server stores: %v", h.Kind, h.APIVersion, err)
	}
	acc, err := meta.Accessor(obj)
	if err != nil {
		return decoded{}, fail(doc.objectLine, "%s %s has no object metadata: %v", h.Kind, h.Metadata.Name, err)
	}
	if mapping.Scope.Name() == meta.RESTScopeNameRoot {
		if acc.GetNamespace() != "" {
			return decoded{}, fail(at("metadata.namespace"), "%s %s is cluster-scoped: remove metadata.namespace", h.Kind, h.Metadata.Name)
		}
	} else if acc.GetNamespace() == "" {
		acc.SetNamespace("default")
	}
	m := decoded{manifest: &manifest{
		key: objectKey{
			objectType: typeOf(mapping.Resource, gvk.Kind),
			namespace:  acc.GetNamespace(),
			name:       acc.GetName(),
		},
		file: file,
		line: int32(doc.objectLine),
		doc:  int32(doc.index),
	}}
	if err := m.setObject(obj); err != nil {
		return decoded{}, fail(doc.objectLine, "%s %s: %v", h.Kind, h.Metadata.Name, err)
	}
	return m, nil
}

// setObject sets m's encoding and digest to obj's. The digest identifies
// an object's content, whatever the formatting of the manifest it came
// from: the hash of its protobuf encoding (which every built-in kind has,
// and which orders map keys), or of its JSON.
func (m *decoded) setObject(obj runtime.Object) error {
	data, _, err := encodeObject(obj)
	if err != nil {
		return fmt.Errorf("encode: %w", err)
	}
	m.encoded, m.digest = data, xxhash.Sum64(data)
	return nil
}

// gvk is the kind of m's object.
func (m *manifest) gvk() schema.GroupVersionKind {
	return m.key.resource.GroupVersion().WithKind(m.key.kind)
}

// decodedFile is what decoding one content of a file gave.
type decodedFile struct {
	digest  string
	objects []*manifest
	// fresh are the objects with their encodings, as the decoding (or the
	// parse cache) gave them, until the pass takes the encodings (see
	// manifestSync.keep).
	fresh []decoded
	err   error
}

// fileToDecode is a file's content that a pass must decode.
type fileToDecode struct {
	name, digest string
	data         []byte
	out          *decodedFile
}

// decodeFiles decodes files in parallel, one worker per CPU: decoding is
// most of the time a large directory takes to load. A file whose content
// is in the parse cache is read from there; one that decodes is cached.
func (s *manifestSync) decodeFiles(files []fileToDecode) {
	next := make(chan *fileToDecode)
	var wg sync.WaitGroup
	for range min(goruntime.GOMAXPROCS(0), len(files)) {
		wg.Go(func() {
			for f := range next {
				f.out.digest = f.digest
				if objs, ok := s.cache.load(f.name, f.digest); ok {
					f.out.fresh = objs
					continue
				}
				f.out.fresh, f.out.err = s.decoder.decodeFile(f.name, f.data)
				if f.out.err != nil {
					continue
				}
				if err := s.cache.store(f.name, f.digest, f.out.fresh); err != nil {
					s.log.Warn("Cannot cache a manifest file's objects; the next start parses it again", "file", f.name, "error", err)
				}
			}
		})
	}
	for i := range files {
		next <- &files[i]
	}
	close(next)
	wg.Wait()
}

// yamlLineRE finds the line in the YAML parser's messages, which is the only
// place it reports it.
var yamlLineRE = regexp.MustCompile(`line (\d+): `)

// yamlErrorLine returns the document line a YAML error names (0 for none)
// and the message without it, on one line.
func yamlErrorLine(err error) (int, string) {
	msg := strings.Join(strings.Fields(err.Error()), " ")
	m := yamlLineRE.FindStringSubmatchIndex(msg)
	if m == nil {
		return 0, msg
	}
	line, _ := strconv.Atoi(msg[m[2]:m[3]])
	return line, msg[:m[0]] + msg[m[1]:]
}

// decodeErrorPathRE finds the field a decoding error is about: strict
// decoding names it in quotes, encoding/json after the Go type's name.
var decodeErrorPathRE = regexp.MustCompile(`(?:unknown field|duplicate field) "([^"]+)"|Go struct field [A-Za-z0-9_]+\.(\S+) of type`)

func decodeErrorPath(err error) string {
	m := decodeErrorPathRE.FindStringSubmatch(err.Error())
	if m == nil {
		return ""
	}
	return m[1] + m[2]
}

// fieldLine returns the line of the field at path ("spec.ports[1].port",
// or without indexes as encoding/json gives it) in a YAML document, or 0.
// Without an index a list must have exactly one item with the field;
// otherwise the list's own line is the best answer.
func fieldLine(data []byte, path string) int {
	if path == "" {
		return 0
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil || len(root.Content) == 0 {
		return 0
	}
	return lineIn(root.Content[0], splitFieldPath(path), 0)
}

// fieldStep is one step of a field path: a key, then an optional index.
type fieldStep struct {
	key   string
	index int // -1: none
}

var fieldStepRE = regexp.MustCompile(`^([^\[\]]*)(?:\[(\d+)\])?$`)

func splitFieldPath(path string) []fieldStep {
	var steps []fieldStep
	for part := range strings.SplitSeq(path, ".") {
		m := fieldStepRE.FindStringSubmatch(part)
		if m == nil {
			return nil
		}
		step := fieldStep{key: m[1], index: -1}
		if m[2] != "" {
			step.index, _ = strconv.Atoi(m[2])
		}
		steps = append(steps, step)
	}
	return steps
}

// lineIn walks steps from n. keyLine is the line of the key holding n.
func lineIn(n *yaml.Node, steps []fieldStep, keyLine int) int {
	if len(steps) == 0 {
		return keyLine
	}
	if n.Kind == yaml.SequenceNode {
		var found []int
		for _, item := range n.Content {
			if line := lineIn(item, steps, item.Line); line > 0 {
				found = append(found, line)
			}
		}
		if len(found) == 1 {
			return found[0]
		}
		return keyLine
	}
	if n.Kind != yaml.MappingNode {
		return 0
	}
	step := steps[0]
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, value := n.Content[i], n.Content[i+1]
		if key.Value != step.key {
			continue
		}
		if step.index < 0 {
			return lineIn(value, steps[1:], key.Line)
		}
		if value.Kind != yaml.SequenceNode || step.index >= len(value.Content) {
			return key.Line
		}
		item := value.Content[step.index]
		return lineIn(item, steps[1:], item.Line)
	}
	return 0
}
