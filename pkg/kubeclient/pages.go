package kubeclient

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// protobufPrefix starts every body kube-apiserver sends in its protobuf
// encoding: "k8s" and a zero byte, then a runtime.Unknown message whose
// raw field is the object's (here the list's) own message.
var protobufPrefix = []byte("k8s\x00")

// pages are the buffers the pages of listings are read into: a page of
// 2,000 Services is a few MB, read again and again into the same buffers
// instead of a new one grown for each page. A listing holds at most two
// at a time (ListPages: the page being decoded and the one read ahead).
var pages = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// pagesHeld counts the buffers taken from pages and not yet given back:
// none once every listing has returned, whatever ended it.
var pagesHeld atomic.Int64

// page is one page of a listing, read whole: its list metadata, known
// before any of its objects is decoded, its objects to decode one at a
// time (each), and done, which gives back what it holds (its buffer).
type page[T any] struct {
	meta metav1.ListMeta
	// size is the length of its body (0 from a fake).
	size int
	each func(func(T) error) error
	done func()
}

// Trim is what a listing leaves out of its objects' metadata besides
// their managed fields, for a caller that reads little of it (the load
// balancer reads an EndpointSlice's service label and no other label or
// annotation): each label and annotation is a string or two and a map
// entry per object.
type Trim struct {
	// Labels, when not nil, are the only labels kept.
	Labels []string
	// NoAnnotations leaves out every annotation.
	NoAnnotations bool
	// NameOnly leaves out of the metadata everything but the namespace,
	// the name and the labels (those Labels keeps): the UID, resource
	// version, generation, times, owner references, finalizers and the
	// like, which a caller that keys its rows by name does not read
	// (decoding them was a fifth of a 50,000-Service restart's
	// allocations). The listing's resource version is the list's, not
	// its objects'.
	NameOnly bool
	// NoSelector leaves out a Service's spec.selector, which says what
	// pods the EndpointSlice controller puts in its slices: a reader of
	// the slices has no use for it, and decoding it was a map and two
	// strings per Service (15-17 MB of a 50,000-Service restart). A
	// listing of another kind ignores it.
	NoSelector bool
}

// ListPages lists every page of opts (opts.Limit objects each), decoding
// each page's objects one at a time into one object and calling each with
// it, and returns the last page's list metadata. client-go's List reads the
// body into a buffer grown for it, copies it into the protobuf envelope
// (runtime.Unknown's raw), and decodes every object into the list's items
// before any is used: at 20,000 Services and their EndpointSlices an
// agent's start allocated 270-280 MB with List, 180-188 MB decoding one at
// a time (docs/performance.md). The objects come without their managed
// fields, and trimmed by trim (see Trim.message).
//
// Once a page is read, and its continue token with it, the next page is
// asked for while this one's objects are decoded and each is called with
// them: the server and the network work on the next page while the client
// converts this one, instead of each waiting for the other. It reads at
// most one page ahead: at most two pages of the listing are in memory at a
// time, the one being decoded and the next.
//
// An error reading the next page is the listing's error, as it is, once
// the objects of the pages before it have been given to each (a 410 Gone
// of an expired continue token stays one, for the caller to list again).
// An error of each, or ctx ending, stops the read ahead and waits for it
// to give back its page before returning.
func (c *client[E, T, L]) ListPages(ctx context.Context, opts metav1.ListOptions, trim Trim, each func(T) error) (metav1.ListMeta, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type read struct {
		p   page[T]
		err error
	}
	p, err := c.readPage(ctx, opts, 0, trim)
	for {
		if err != nil {
			return metav1.ListMeta{}, err
		}
		var next chan read
		if p.meta.Continue != "" {
			// The next page continues the same snapshot; a resource
			// version beside a continue token is refused.
			opts.Continue, opts.ResourceVersion, opts.ResourceVersionMatch = p.meta.Continue, "", ""
			next = make(chan read, 1)
			go func(opts metav1.ListOptions, size int) {
				p, err := c.readPage(ctx, opts, size, trim)
				next <- read{p, err}
			}(opts, p.size)
		}
		err = p.each(each)
		p.done()
		if next == nil {
			if err != nil {
				return metav1.ListMeta{}, err
			}
			return p.meta, nil
		}
		if err != nil {
			cancel()
			if r := <-next; r.err == nil {
				r.p.done()
			}
			return metav1.ListMeta{}, err
		}
		r := <-next
		p, err = r.p, r.err
	}
}

// readPage reads the page of opts whole: into a buffer of pages from a
// real API server (in protobuf, or JSON if it answers so), a typed list
// from a fake's List. size is the length of the page before it, if any:
// the buffer is grown to about that once, rather than doubled up to it
// from what the pool gave (a GC empties the pool: at 50,000 Services the
// buffers' growth was 29-37 MB of a restart's ~440 MB allocated, 17-22 MB
// so).
func (c *client[E, T, L]) readPage(ctx context.Context, opts metav1.ListOptions, size int, trim Trim) (page[T], error) {
	if c.rest == nil {
		l, err := c.List(ctx, opts)
		if err != nil {
			return page[T]{}, err
		}
		return c.listPage(l, trim), nil
	}
	var timeout time.Duration
	if opts.TimeoutSeconds != nil {
		timeout = time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	body, err := c.rest.Get().
		UseProtobufAsDefault().
		NamespaceIfScoped(c.ns, c.ns != "").
		Resource(c.gvr.Resource).
		VersionedParams(&opts, ParameterCodec).
		Timeout(timeout).
		Stream(ctx)
	if err != nil {
		return page[T]{}, err
	}
	defer body.Close()
	buf := pages.Get().(*bytes.Buffer)
	pagesHeld.Add(1)
	done := func() {
		pages.Put(buf)
		pagesHeld.Add(-1)
	}
	buf.Reset()
	buf.Grow(size + size/8 + bytes.MinRead)
	if _, err := buf.ReadFrom(body); err != nil {
		done()
		return page[T]{}, fmt.Errorf("list %s: reading the response: %w", c.gvr.Resource, err)
	}
	data := buf.Bytes()
	if !bytes.HasPrefix(data, protobufPrefix) {
		// JSON, which a server may answer with instead (the request
		// accepts it): decoded whole, the buffer given back at once.
		defer done()
		l := c.newList()
		if _, _, err := Codecs.UniversalDeserializer().Decode(data, nil, l); err != nil {
			return page[T]{}, fmt.Errorf("list %s: %w", c.gvr.Resource, err)
		}
		return c.listPage(l, trim), nil
	}
	raw, meta, err := listOf(data[len(protobufPrefix):], c.listKind)
	if err != nil {
		done()
		return page[T]{}, fmt.Errorf("list %s: %w", c.gvr.Resource, err)
	}
	return page[T]{
		meta: meta,
		size: len(data),
		each: func(each func(T) error) error {
			if err := eachItem(raw, c.listKind, T(new(E)), trim, each); err != nil {
				return fmt.Errorf("list %s: %w", c.gvr.Resource, err)
			}
			return nil
		},
		done: done,
	}, nil
}

// listPage is the page of a typed list l, its objects trimmed as
// eachItem's.
func (c *client[E, T, L]) listPage(l L, trim Trim) page[T] {
	return page[T]{
		meta: metav1.ListMeta{
			ResourceVersion: l.GetResourceVersion(), Continue: l.GetContinue(), RemainingItemCount: l.GetRemainingItemCount(),
		},
		each: func(each func(T) error) error {
			for i := range *c.items(l) {
				obj := T(&(*c.items(l))[i])
				trim.Object(obj)
				if err := each(obj); err != nil {
					return err
				}
			}
			return nil
		},
		done: func() {},
	}
}

// listOf is the list of kind listKind in data, a runtime.Unknown holding
// it (its ListMeta field 1, its items field 2, as every list of k8s.io/api
// has them): the list's message, and its list metadata, read without
// decoding any item.
func listOf(data []byte, listKind string) (raw []byte, meta metav1.ListMeta, err error) {
	var kind, encoding string
	err = messageFields(data, func(num protowire.Number, v []byte) error {
		switch num {
		case 1: // typeMeta
			return messageFields(v, func(num protowire.Number, v []byte) error {
				if num == 2 { // kind
					kind = string(v)
				}
				return nil
			})
		case 2: // raw
			raw = v
		case 3: // contentEncoding
			encoding = string(v)
		}
		return nil
	})
	switch {
	case err != nil:
		return nil, meta, fmt.Errorf("the protobuf envelope: %w", err)
	case kind != listKind:
		return nil, meta, fmt.Errorf("got a %q, want a %s", kind, listKind)
	case encoding != "":
		return nil, meta, fmt.Errorf("a %s in the unknown encoding %q", listKind, encoding)
	}
	err = messageFields(raw, func(num protowire.Number, v []byte) error {
		if num == 1 {
			return meta.Unmarshal(v)
		}
		return nil
	})
	if err != nil {
		return nil, metav1.ListMeta{}, fmt.Errorf("a %s: %w", listKind, err)
	}
	return raw, meta, nil
}

// eachItem decodes the items of raw, the message of a list of kind
// listKind (listOf's), each into obj in turn, calling each with it.
//
// Each object comes without its managed fields, and trimmed (see
// Trim.message). Its labels are decoded into the map of the object before
// it, emptied: a map per object was most of what decoding a labelled
// object's metadata allocated (an EndpointSlice keeps its service label:
// 16 MB at 50,000 of them). each must not keep the map.
func eachItem[E any, T object[E]](raw []byte, listKind string, obj T, trim Trim, each func(T) error) error {
	var zero E
	var scratch []byte
	var labels map[string]string
	item := 0
	t := trim.of(listKind)
	err := messageFields(raw, func(num protowire.Number, v []byte) error {
		if num != 2 {
			return nil
		}
		v, scratch = t.message(v, scratch)
		*obj = zero
		if labels != nil {
			clear(labels)
			obj.SetLabels(labels)
		}
		if err := obj.Unmarshal(v); err != nil {
			return fmt.Errorf("item %d: %w", item, err)
		}
		labels = obj.GetLabels()
		item++
		return each(obj)
	})
	if err != nil {
		return fmt.Errorf("a %s: %w", listKind, err)
	}
	return nil
}

// message is item, the message of an object of k8s.io/api, with what t
// leaves out of its metadata (ObjectMeta, its field 1) left out, and its
// managed fields (field 17), written into scratch, which it returns
// grown; item itself when there is nothing to leave out, or when it is
// not a message (Unmarshal then says so).
//
// A listing's objects go to code that reads their names, labels and
// specs, none their managed fields, and decoding them was a fifth of a
// listing's allocations (a string or four and a copy of the fields' JSON
// for each entry): at 50,000 Services and their EndpointSlices, 40-45 MB
// of an agent's restart.
func (t Trim) message(item, scratch []byte) (out, grown []byte) {
	// One walk: every field copied into out as it comes, those t looks
	// into (its metadata, a Service's spec) with only what they keep,
	// behind room for their tag and length, written once their length is
	// known. (Counting what is left out first, then copying, walked the
	// metadata three times: 0.12 s of a 50,000-Service restart.)
	const room = 1 + binary.MaxVarintLen32 // a tag below 16, a length below 4 GB
	out = scratch[:0]
	cut, bad := false, false
	ok := rawFields(item, func(top protowire.Number, field, v []byte) {
		if bad {
			return
		}
		if !t.into(top) || v == nil {
			out = append(out, field...)
			return
		}
		at := len(out)
		out = append(out, make([]byte, room)...)
		if !rawFields(v, func(num protowire.Number, field, v []byte) {
			if t.dropsIn(top, num, v) {
				cut = true
			} else {
				out = append(out, field...)
			}
		}) {
			bad = true
			return
		}
		size := len(out) - at - room
		var header [room]byte
		h := protowire.AppendVarint(protowire.AppendTag(header[:0], top, protowire.BytesType), uint64(size))
		copy(out[at:], h)
		copy(out[at+len(h):], out[at+room:])
		out = out[:at+len(h)+size]
	})
	if !ok || bad || !cut {
		return item, out
	}
	return out, out
}

// of is t for a listing of listKind: NoSelector only for Services.
func (t Trim) of(listKind string) Trim {
	if listKind != serviceListKind {
		t.NoSelector = false
	}
	return t
}

// into says whether t leaves out any of the object's field top: its
// metadata (field 1) or, with NoSelector, a Service's spec (field 2).
func (t Trim) into(top protowire.Number) bool {
	return top == metadataNumber || top == specNumber && t.NoSelector
}

// dropsIn says whether t leaves out field num, v its contents, of the
// object's field top.
func (t Trim) dropsIn(top, num protowire.Number, v []byte) bool {
	if top == specNumber {
		return t.NoSelector && num == selectorNumber
	}
	return t.drops(num, v)
}

// drops says whether t leaves out field num of an ObjectMeta, v its
// contents.
func (t Trim) drops(num protowire.Number, v []byte) bool {
	switch num {
	case managedFieldsNumber:
		return true
	case annotationsNumber:
		return t.NoAnnotations || t.NameOnly
	case nameNumber, namespaceNumber:
		return false
	case labelsNumber:
		if t.Labels == nil {
			return false
		}
		// A map entry: its key is field 1.
		var key []byte
		rawFields(v, func(num protowire.Number, _, v []byte) {
			if num == 1 {
				key = v
			}
		})
		return !slices.Contains(t.Labels, string(key))
	}
	return t.NameOnly
}

// Object trims obj as a page's are (message): a fake's or a JSON page's.
func (t Trim) Object(obj metav1.Object) {
	obj.SetManagedFields(nil)
	if svc, ok := obj.(*corev1.Service); ok && t.NoSelector {
		svc.Spec.Selector = nil
	}
	if t.NoAnnotations || t.NameOnly {
		obj.SetAnnotations(nil)
	}
	if t.NameOnly {
		// Everything of ObjectMeta's but the namespace, name and labels.
		obj.SetGenerateName("")
		obj.SetSelfLink("")
		obj.SetUID("")
		obj.SetResourceVersion("")
		obj.SetGeneration(0)
		obj.SetCreationTimestamp(metav1.Time{})
		obj.SetDeletionTimestamp(nil)
		obj.SetDeletionGracePeriodSeconds(nil)
		obj.SetOwnerReferences(nil)
		obj.SetFinalizers(nil)
	}
	if labels := obj.GetLabels(); t.Labels != nil && labels != nil {
		maps.DeleteFunc(labels, func(k, _ string) bool { return !slices.Contains(t.Labels, k) })
	}
}

// ObjectMeta's fields name, namespace, labels, annotations and
// managedFields.
const (
	nameNumber          = 1
	namespaceNumber     = 3
	labelsNumber        = 11
	annotationsNumber   = 12
	managedFieldsNumber = 17
)

// An object's metadata and spec (k8s.io/api's field numbers, the same in
// every kind that has a spec), ServiceSpec's selector, and the kind of a
// list of Services.
const (
	metadataNumber  = 1
	specNumber      = 2
	selectorNumber  = 2
	serviceListKind = "ServiceList"
)

// rawFields calls fn with the number of each field of the protobuf message
// data, the field as it is encoded (its tag and value) and, for a
// length-delimited one, its contents (nil for the others), and says
// whether data was read to its end: a field that does not parse stops it.
func rawFields(data []byte, fn func(num protowire.Number, field, v []byte)) bool {
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return false
		}
		var v []byte
		m := 0
		if typ == protowire.BytesType {
			v, m = protowire.ConsumeBytes(data[n:])
			if v == nil && m >= 0 {
				v = data[n:n]
			}
		} else {
			m = protowire.ConsumeFieldValue(num, typ, data[n:])
		}
		if m < 0 {
			return false
		}
		fn(num, data[:n+m], v)
		data = data[n+m:]
	}
	return true
}

// messageFields calls fn with the number and the contents of each field of
// the protobuf message data whose wire type is length-delimited (a
// message, a string, bytes), in order, and skips the others.
func messageFields(data []byte, fn func(num protowire.Number, v []byte) error) error {
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return protowire.ParseError(n)
		}
		data = data[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, data); n < 0 {
				return protowire.ParseError(n)
			}
			data = data[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(data)
		if n < 0 {
			return protowire.ParseError(n)
		}
		data = data[n:]
		if err := fn(num, v); err != nil {
			return err
		}
	}
	return nil
}
