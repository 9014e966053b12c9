package kubeclient

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// protobufPrefix starts every body kube-apiserver sends in its protobuf
// encoding: "k8s" and a zero byte, then a runtime.Unknown message whose
// raw field is the object's (here the list's) own message.
var protobufPrefix = []byte("k8s\x00")

// pages are the buffers the pages of listings are read into, one per
// listing at a time: a page of 2,000 Services is a few MB, read again and
// again into the same buffer instead of a new one grown for each page.
var pages = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// ListEach reads the page and decodes its objects one at a time into one
// object: client-go's List reads the body into a buffer grown for it,
// copies it into the protobuf envelope (runtime.Unknown's raw), and
// decodes every object into the list's items before any is used. At
// 20,000 Services and their EndpointSlices an agent's start allocated
// 270-280 MB with List, 180-188 MB with ListEach (docs/performance.md).
func (c *client[E, T, L]) ListEach(ctx context.Context, opts metav1.ListOptions, each func(T) error) (metav1.ListMeta, error) {
	if c.rest == nil {
		return c.listEachOf(ctx, opts, each)
	}
	var timeout time.Duration
	if opts.TimeoutSeconds != nil {
		timeout = time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	body, err := c.rest.Get().
		UseProtobufAsDefault().
		NamespaceIfScoped(c.ns, c.ns != "").
		Resource(c.resource).
		VersionedParams(&opts, ParameterCodec).
		Timeout(timeout).
		Stream(ctx)
	if err != nil {
		return metav1.ListMeta{}, err
	}
	defer body.Close()
	buf := pages.Get().(*bytes.Buffer)
	defer pages.Put(buf)
	buf.Reset()
	if _, err := buf.ReadFrom(body); err != nil {
		return metav1.ListMeta{}, fmt.Errorf("list %s: reading the response: %w", c.resource, err)
	}
	data := buf.Bytes()
	if !bytes.HasPrefix(data, protobufPrefix) {
		// JSON, which a server may answer with instead (the request
		// accepts it).
		l := c.newList()
		if _, _, err := Codecs.UniversalDeserializer().Decode(data, nil, l); err != nil {
			return metav1.ListMeta{}, fmt.Errorf("list %s: %w", c.resource, err)
		}
		return c.each(l, each)
	}
	meta, err := eachItem(data[len(protobufPrefix):], c.listKind, T(new(E)), each)
	if err != nil {
		return metav1.ListMeta{}, fmt.Errorf("list %s: %w", c.resource, err)
	}
	return meta, nil
}

// listEachOf is ListEach of a fake's client: its List, item by item.
func (c *client[E, T, L]) listEachOf(ctx context.Context, opts metav1.ListOptions, each func(T) error) (metav1.ListMeta, error) {
	l, err := c.List(ctx, opts)
	if err != nil {
		return metav1.ListMeta{}, err
	}
	return c.each(l, each)
}

// each calls each with l's items, and returns l's list metadata.
func (c *client[E, T, L]) each(l L, each func(T) error) (metav1.ListMeta, error) {
	for i := range *c.items(l) {
		if err := each(T(&(*c.items(l))[i])); err != nil {
			return metav1.ListMeta{}, err
		}
	}
	return metav1.ListMeta{
		ResourceVersion: l.GetResourceVersion(), Continue: l.GetContinue(), RemainingItemCount: l.GetRemainingItemCount(),
	}, nil
}

// eachItem decodes data, a runtime.Unknown holding a list of kind
// listKind (its ListMeta field 1, its items field 2, as every list of
// k8s.io/api has them), decoding each item into obj in turn and calling
// each with it.
func eachItem[E any, T object[E]](data []byte, listKind string, obj T, each func(T) error) (metav1.ListMeta, error) {
	var (
		kind, encoding string
		raw            []byte
		meta           metav1.ListMeta
	)
	err := messageFields(data, func(num protowire.Number, v []byte) error {
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
		return meta, fmt.Errorf("the protobuf envelope: %w", err)
	case kind != listKind:
		return meta, fmt.Errorf("got a %q, want a %s", kind, listKind)
	case encoding != "":
		return meta, fmt.Errorf("a %s in the unknown encoding %q", listKind, encoding)
	}
	var zero E
	item := 0
	err = messageFields(raw, func(num protowire.Number, v []byte) error {
		switch num {
		case 1:
			return meta.Unmarshal(v)
		case 2:
			*obj = zero
			if err := obj.Unmarshal(v); err != nil {
				return fmt.Errorf("item %d: %w", item, err)
			}
			item++
			return each(obj)
		}
		return nil
	})
	if err != nil {
		return metav1.ListMeta{}, fmt.Errorf("a %s: %w", listKind, err)
	}
	return meta, nil
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
