package kubeclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/cellium/cellium/pkg/kubeapitest"
)

// testServices are Services with what a real one has: labels, annotations,
// managed fields, ports, addresses.
func testServices(n int) []corev1.Service {
	out := make([]corev1.Service, n)
	for i := range out {
		out[i] = corev1.Service{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
			ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns-%d", i%3), Name: fmt.Sprintf("svc-%d", i),
				Labels: map[string]string{"app": fmt.Sprint(i)}, Annotations: map[string]string{"note": strings.Repeat("x", i)},
				ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply,
					FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(fmt.Sprintf(`{"f:spec":{"f:ports":%d}}`, i))}}}},
			Spec: corev1.ServiceSpec{ClusterIP: fmt.Sprintf("10.96.0.%d", i+1), ClusterIPs: []string{fmt.Sprintf("10.96.0.%d", i+1)},
				Ports: []corev1.ServicePort{{Name: "http", Port: int32(80 + i), Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}}},
		}
	}
	return out
}

// encode is list as kube-apiserver sends it in protobuf.
func encode(t *testing.T, list runtime.Object) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := protobuf.NewSerializer(Scheme, Scheme).Encode(list, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// decodePage is a page's list metadata (listOf) and its items (eachItem).
func decodePage(data []byte, listKind string, obj *corev1.Service, each func(*corev1.Service) error) (metav1.ListMeta, error) {
	raw, meta, err := listOf(data, listKind)
	if err != nil {
		return meta, err
	}
	return meta, eachItem(raw, listKind, obj, Trim{}, each)
}

// Each object of a page has its own labels, none of the object's before
// it, though they are decoded into its map; it allocates no map of its own.
func TestEachItemLabels(t *testing.T) {
	items := testServices(5)
	items[1].Labels = map[string]string{"b": "2", "c": "3"}
	items[2].Labels = nil
	items[3].Labels = map[string]string{"a": "9"}
	data := encode(t, &corev1.ServiceList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceList"}, Items: items})
	var maps []uintptr
	i := 0
	_, err := decodePage(data[len(protobufPrefix):], "ServiceList", &corev1.Service{}, func(s *corev1.Service) error {
		if len(s.Labels) != len(items[i].Labels) || !equality.Semantic.DeepEqual(s.Labels, items[i].Labels) && len(s.Labels) > 0 {
			t.Errorf("item %d has labels %v, want %v", i, s.Labels, items[i].Labels)
		}
		if s.Labels != nil {
			maps = append(maps, reflect.ValueOf(s.Labels).Pointer())
		}
		i++
		return nil
	})
	if err != nil || i != len(items) {
		t.Fatalf("decoded %d of %d items: %v", i, len(items), err)
	}
	if maps = slices.Compact(maps); len(maps) != 1 {
		t.Errorf("labels decoded into %d maps, want one", len(maps))
	}
}

// A page in protobuf decodes, one object at a time into the same one, to
// the objects and list metadata that were encoded.
func TestEachItemDecodesAPage(t *testing.T) {
	want := &corev1.ServiceList{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceList"},
		ListMeta: metav1.ListMeta{ResourceVersion: "42", Continue: "token"},
		Items:    testServices(5),
	}
	data := encode(t, want)
	if !bytes.HasPrefix(data, protobufPrefix) {
		t.Fatalf("the encoding starts %q", data[:8])
	}
	var got []corev1.Service
	var seen *corev1.Service
	meta, err := decodePage(data[len(protobufPrefix):], "ServiceList", &corev1.Service{}, func(s *corev1.Service) error {
		if seen != nil && s != seen {
			t.Error("each item is a new object, want the same one decoded into again")
		}
		seen = s
		got = append(got, *s.DeepCopy())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if meta.ResourceVersion != "42" || meta.Continue != "token" {
		t.Errorf("list metadata %+v, want version 42 and continue token", meta)
	}
	for i := range want.Items {
		// The objects of a list are encoded without their kind, and
		// decoded without their managed fields.
		want.Items[i].TypeMeta = metav1.TypeMeta{}
		want.Items[i].ManagedFields = nil
	}
	if !equality.Semantic.DeepEqual(got, want.Items) {
		t.Errorf("decoded %d objects\n%+v\nwant %d\n%+v", len(got), got, len(want.Items), want.Items)
	}

	// An error of each stops the page with it.
	stop := fmt.Errorf("stop")
	n := 0
	if _, err := decodePage(data[len(protobufPrefix):], "ServiceList", &corev1.Service{}, func(*corev1.Service) error { n++; return stop }); err == nil || !strings.Contains(err.Error(), "stop") || n != 1 {
		t.Errorf("each failing: %v after %d objects, want its error after 1", err, n)
	}
}

// Trim.message leaves out every managed fields entry of an
// object's metadata, wherever it is among the other fields and however
// many times the metadata comes, and nothing else; an object without any
// is given back as it is, and so is one that does not parse.
func TestWithoutManagedFields(t *testing.T) {
	svc := testServices(3)[2]
	svc.ManagedFields = append(svc.ManagedFields, metav1.ManagedFieldsEntry{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate})
	svc.OwnerReferences = []metav1.OwnerReference{{Name: "after-the-managed-fields"}}
	full, err := svc.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	// The metadata again, a second message merged into the first: a
	// finalizer (field 14) and a managed fields entry.
	entry, err := (&metav1.ManagedFieldsEntry{Manager: "again"}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	more := protowire.AppendString(protowire.AppendTag(nil, 14, protowire.BytesType), "second")
	more = protowire.AppendBytes(protowire.AppendTag(more, managedFieldsNumber, protowire.BytesType), entry)
	full = protowire.AppendBytes(protowire.AppendTag(full, 1, protowire.BytesType), more)

	out, scratch := (Trim{}).message(full, nil)
	var got corev1.Service
	if err := got.Unmarshal(out); err != nil {
		t.Fatal(err)
	}
	want := svc
	want.TypeMeta, want.ManagedFields, want.Finalizers = metav1.TypeMeta{}, nil, []string{"second"}
	if !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("without managed fields\n%+v\nwant\n%+v", got, want)
	}
	if len(out) >= len(full) || &out[0] != &scratch[0] {
		t.Errorf("%d bytes of %d, written into scratch: %v", len(out), len(full), &out[0] == &scratch[0])
	}

	svc.ManagedFields = nil
	bare, err := svc.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if out, _ := (Trim{}).message(bare, scratch); &out[0] != &bare[0] || len(out) != len(bare) {
		t.Error("an object without managed fields was copied")
	}
	for _, cut := range []int{len(full) - 1, 40} {
		if out, _ := (Trim{}).message(full[:cut], scratch); &out[0] != &full[0] || len(out) != cut {
			t.Errorf("an object cut at %d of %d bytes was rewritten", cut, len(full))
		}
	}
}

// A Trim leaves out the labels it does not keep and the annotations, in a
// page and in a fake's list alike, and nothing else.
func TestTrim(t *testing.T) {
	svc := testServices(3)[2]
	svc.Labels["kubernetes.io/service-name"] = "kept"
	svc.Labels["other"] = "dropped"
	// Every field of the spec around the selector, and the status.
	local := corev1.ServiceInternalTrafficPolicyLocal
	svc.Spec.Selector = map[string]string{"app": "web", "tier": "front"}
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	svc.Spec.ExternalIPs = []string{"192.0.2.10"}
	svc.Spec.Ports[0].NodePort = 30080
	svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	svc.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: new(int32(60))}}
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	svc.Spec.InternalTrafficPolicy = &local
	svc.Spec.HealthCheckNodePort = 31000
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.20"}}
	// Every field of the metadata.
	grace := int64(30)
	svc.GenerateName, svc.SelfLink, svc.UID, svc.ResourceVersion, svc.Generation = "svc-", "/api/v1/x", "8d6f2a54-0b0e-4f3c-9c1e-2a8f1a3b7c11", "4711", 3
	svc.CreationTimestamp, svc.DeletionTimestamp, svc.DeletionGracePeriodSeconds = metav1.Unix(1795900000, 0), &metav1.Time{Time: time.Unix(1795900100, 0)}, &grace
	svc.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "owner", UID: "0c6e9f5a-1f0b-4f5e-8b7e-2d9b9f7c1a22"}}
	svc.Finalizers = []string{"example.com/keep"}
	data, err := svc.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	want := svc
	want.TypeMeta, want.ManagedFields = metav1.TypeMeta{}, nil
	want.Labels, want.Annotations = map[string]string{"kubernetes.io/service-name": "kept"}, nil
	for _, tc := range []struct {
		trim Trim
		want func(*corev1.Service)
	}{
		{Trim{Labels: []string{"kubernetes.io/service-name", "absent"}, NoAnnotations: true}, func(*corev1.Service) {}},
		{Trim{Labels: []string{}}, func(s *corev1.Service) { s.Labels, s.Annotations = nil, svc.Annotations }},
		{Trim{NoAnnotations: true}, func(s *corev1.Service) { s.Labels = svc.Labels }},
		{Trim{Labels: []string{"kubernetes.io/service-name"}, NoAnnotations: true, NoSelector: true}, func(s *corev1.Service) { s.Spec.Selector = nil }},
		{Trim{NoSelector: true}, func(s *corev1.Service) { s.Labels, s.Annotations, s.Spec.Selector = svc.Labels, svc.Annotations, nil }},
		{Trim{Labels: []string{"kubernetes.io/service-name"}, NameOnly: true}, func(s *corev1.Service) {
			s.ObjectMeta = metav1.ObjectMeta{Namespace: svc.Namespace, Name: svc.Name, Labels: s.Labels}
		}},
	} {
		w := *want.DeepCopy()
		tc.want(&w)
		out, _ := tc.trim.of("ServiceList").message(data, nil)
		var got corev1.Service
		if err := got.Unmarshal(out); err != nil {
			t.Fatal(err)
		}
		fake := *svc.DeepCopy()
		fake.TypeMeta = metav1.TypeMeta{}
		tc.trim.Object(&fake)
		for what, got := range map[string]corev1.Service{"decoded": got, "a fake's": fake} {
			if len(got.Labels) == 0 && len(w.Labels) == 0 {
				got.Labels = w.Labels
			}
			if !equality.Semantic.DeepEqual(got, w) {
				t.Errorf("%+v, %s: labels %v annotations %v, want %v %v; equal otherwise: %v", tc.trim, what, got.Labels, got.Annotations, w.Labels, w.Annotations,
					equality.Semantic.DeepEqual(got.Spec, w.Spec) && got.Name == w.Name)
			}
		}
	}
}

// NoSelector is for Services: another kind's listing keeps its field 2 of
// field 2 (an EndpointSlice's first endpoint's addresses).
func TestNoSelectorOnlyOfServices(t *testing.T) {
	ready := true
	slice := discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-abcde"},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.5"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}}}
	data, err := slice.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	out, _ := Trim{NoSelector: true}.of("EndpointSliceList").message(data, nil)
	var got discoveryv1.EndpointSlice
	if err := got.Unmarshal(out); err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(got, slice) {
		t.Errorf("EndpointSlice trimmed with NoSelector: %+v, want it whole: %+v", got, slice)
	}
}

// A page that is not the list asked for, or is cut short, is an error
// naming what was wanted and what came.
func TestEachItemRejectsBadPages(t *testing.T) {
	slices := encode(t, &discoveryv1.EndpointSliceList{TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSliceList"}})
	_, err := decodePage(slices[len(protobufPrefix):], "ServiceList", &corev1.Service{}, func(*corev1.Service) error { return nil })
	if err == nil || !strings.Contains(err.Error(), `got a "EndpointSliceList", want a ServiceList`) {
		t.Errorf("an EndpointSliceList read as a ServiceList: %v", err)
	}
	data := encode(t, &corev1.ServiceList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceList"}, Items: testServices(3)})
	for _, cut := range []int{len(data) - 1, len(data) / 2, len(protobufPrefix) + 3} {
		_, err := decodePage(data[len(protobufPrefix):cut], "ServiceList", &corev1.Service{}, func(*corev1.Service) error { return nil })
		if err == nil {
			t.Errorf("a page cut at %d of %d bytes decoded without an error", cut, len(data))
		}
	}
}

// listServer is a Server answering every list with its list.
type listServer struct{ list runtime.Object }

func (s listServer) Invoke(req Request) (runtime.Object, error) {
	if req.Verb != "list" {
		return nil, fmt.Errorf("%s: only lists are served", req.Verb)
	}
	return s.list.DeepCopyObject(), nil
}

func (listServer) InvokeWatch(Request) (watch.Interface, error) { return nil, errors.New("no watches") }

// A Server's client lists each object of its List, without its managed
// fields as a real API server's.
func TestListPagesOfServer(t *testing.T) {
	server := listServer{&corev1.ServiceList{ListMeta: metav1.ListMeta{ResourceVersion: "7"}, Items: testServices(3)}}
	c := New(NewServedSource(server, corev1.SchemeGroupVersion), "services", "Service", "", func(l *corev1.ServiceList) *[]corev1.Service { return &l.Items })
	var names []string
	meta, err := c.ListPages(context.Background(), metav1.ListOptions{}, Trim{}, func(s *corev1.Service) error {
		names = append(names, s.Name)
		if s.ManagedFields != nil {
			t.Errorf("%s listed with managed fields, as a real API server's are not", s.Name)
		}
		return nil
	})
	if err != nil || meta.ResourceVersion != "7" || fmt.Sprint(names) != "[svc-0 svc-1 svc-2]" {
		t.Errorf("ListPages of a Server: %v %q %v", err, meta.ResourceVersion, names)
	}
}

// Against a real kube-apiserver, ListPages gives the objects List has, in
// protobuf (and in JSON, when the client asks for it), one request per
// page, its continue tokens leading through the listing. The subtests of
// its read ahead share the server.
func TestListPagesOfAPIServer(t *testing.T) {
	kas := kubeapitest.StartOnEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 25
	for i, s := range testServices(n) {
		if i < 3 {
			if _, err := kas.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.Namespace}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		s.ManagedFields, s.Spec.ClusterIP, s.Spec.ClusterIPs = nil, "", nil
		if _, err := kas.Admin.CoreV1().Services(s.Namespace).Create(ctx, &s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, contentType := range []string{"", "application/json"} {
		cfg := kas.Config(kubeapitest.AdminToken)
		cfg.ContentType = contentType
		wire := kubeapitest.RecordWire(cfg)
		src, err := NewRESTSource(cfg, mustHTTPClient(t, cfg), corev1.SchemeGroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		c := New(src, "services", "Service", "", func(l *corev1.ServiceList) *[]corev1.Service { return &l.Items })
		want, err := c.List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		managed := 0
		for i := range want.Items {
			// The API server's own (the Services' creation), which
			// ListPages leaves out.
			managed += len(want.Items[i].ManagedFields)
			want.Items[i].ManagedFields = nil
		}
		if managed == 0 {
			t.Fatal("the API server keeps no managed fields: nothing to leave out")
		}
		// n and the API server's own, default/kubernetes.
		if len(want.Items) != n+1 {
			t.Fatalf("List gave %d objects, want %d", len(want.Items), n+1)
		}
		var got []corev1.Service
		asked := len(wire.Exchanges())
		meta, err := c.ListPages(ctx, metav1.ListOptions{Limit: 10}, Trim{}, func(s *corev1.Service) error {
			got = append(got, *s.DeepCopy())
			return nil
		})
		if err != nil || meta.Continue != "" || meta.ResourceVersion == "" || !equality.Semantic.DeepEqual(got, want.Items) || len(wire.Exchanges())-asked != 3 {
			t.Errorf("content type %q: ListPages gave %d objects in %d requests (List %d; equal: %v), %v, last page's %+v", contentType, len(got), len(wire.Exchanges())-asked, len(want.Items), equality.Semantic.DeepEqual(got, want.Items), err, meta)
		}
		// A relist's pages (the load balancer's): not older than the
		// version last seen, in pages, continued past the first.
		got = nil
		asked = len(wire.Exchanges())
		relist := metav1.ListOptions{ResourceVersion: want.ResourceVersion, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, Limit: 10}
		if _, err := c.ListPages(ctx, relist, Trim{}, func(s *corev1.Service) error {
			got = append(got, *s.DeepCopy())
			return nil
		}); err != nil || !equality.Semantic.DeepEqual(got, want.Items) || len(wire.Exchanges())-asked != 3 {
			t.Errorf("content type %q: a relist not older than %s gave %d objects in %d requests (List %d; equal: %v), %v", contentType, want.ResourceVersion, len(got), len(wire.Exchanges())-asked, len(want.Items), equality.Semantic.DeepEqual(got, want.Items), err)
		}
		wantType := kubeapitest.Protobuf
		if contentType != "" {
			wantType = contentType
		}
		for _, e := range wire.Exchanges() {
			if e.ResponseType != wantType {
				t.Errorf("%s %s?%s: response %q, want %q", e.Method, e.Path, e.Query, e.ResponseType, wantType)
			}
		}
		if held := pagesHeld.Load(); held != 0 {
			t.Errorf("content type %q: %d pages held after the listings", contentType, held)
		}
	}

	// A client whose requests for a listing's later pages pt sees.
	client := func(t *testing.T) (Client[*corev1.Service, *corev1.ServiceList], *pageTripper) {
		cfg := kas.Config(kubeapitest.AdminToken)
		pt := &pageTripper{asked: make(chan int, 16), read: make(chan int, 16)}
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { pt.next = rt; return pt })
		src, err := NewRESTSource(cfg, mustHTTPClient(t, cfg), corev1.SchemeGroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		return New(src, "services", "Service", "", func(l *corev1.ServiceList) *[]corev1.Service { return &l.Items }), pt
	}
	// wait is the number of the next request pt is sent, or 0 when none
	// comes in 30 s (a failure: what should ask for it does not).
	wait := func(ch chan int) int {
		select {
		case k := <-ch:
			return k
		case <-time.After(30 * time.Second):
			return 0
		}
	}

	t.Run("the next page is asked for while a page is converted", func(t *testing.T) {
		c, pt := client(t)
		i, asked := 0, 0
		var names []string
		_, err := c.ListPages(ctx, metav1.ListOptions{Limit: 10}, Trim{}, func(s *corev1.Service) error {
			names = append(names, s.Namespace+"/"+s.Name)
			// The first object of each page but the last: its
			// conversion goes on only once the next page is asked for.
			if page := i / 10; i%10 == 0 && page < 2 {
				if k := wait(pt.asked); k != page+1 {
					return fmt.Errorf("page %d converted, and request %d of a next page sent in 30 s; want %d", page, k, page+1)
				}
				asked++
			}
			i++
			return nil
		})
		if err != nil || asked != 2 || len(names) != n+1 {
			t.Errorf("ListPages: %v, %d objects, the next page asked for during the conversion of %d pages, want %d objects and 2", err, len(names), asked, n+1)
		}
	})

	t.Run("an error of the page read ahead is the listing's", func(t *testing.T) {
		c, pt := client(t)
		// The third page's continue token has expired: the API server's
		// 410 Gone.
		pt.answer = func(k int, req *http.Request) (*http.Response, error) {
			if k != 2 {
				return nil, nil
			}
			status := `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"The provided continue parameter is too old","reason":"Expired","code":410}`
			return &http.Response{StatusCode: http.StatusGone, Status: "410 Gone", Header: http.Header{"Content-Type": {"application/json"}},
				Body: io.NopCloser(strings.NewReader(status)), ContentLength: int64(len(status)), Request: req}, nil
		}
		got := 0
		_, err := c.ListPages(ctx, metav1.ListOptions{Limit: 10}, Trim{}, func(*corev1.Service) error { got++; return nil })
		if !apierrors.IsResourceExpired(err) || got != 20 {
			t.Errorf("ListPages with its third page gone: %v after %d objects, want an expired error after 20", err, got)
		}
		if held := pagesHeld.Load(); held != 0 {
			t.Errorf("%d pages held after the listing failed", held)
		}
	})

	t.Run("an error of each gives back the page read ahead", func(t *testing.T) {
		c, pt := client(t)
		stop := errors.New("stop")
		_, err := c.ListPages(ctx, metav1.ListOptions{Limit: 10}, Trim{}, func(*corev1.Service) error {
			// The second page read whole, waiting for the first's
			// conversion.
			if k := wait(pt.read); k != 1 {
				return fmt.Errorf("the second page not read in 30 s (%d)", k)
			}
			return stop
		})
		if !errors.Is(err, stop) {
			t.Errorf("ListPages with each failing: %v, want %v", err, stop)
		}
		if held := pagesHeld.Load(); held != 0 {
			t.Errorf("%d pages held once ListPages returned", held)
		}
		noReadAhead(t)
	})

	t.Run("an error of each ends the read ahead", func(t *testing.T) {
		c, pt := client(t)
		// The second page's response never comes.
		pt.answer = func(_ int, req *http.Request) (*http.Response, error) {
			<-req.Context().Done()
			return nil, req.Context().Err()
		}
		stop := errors.New("stop")
		_, err := c.ListPages(ctx, metav1.ListOptions{Limit: 10}, Trim{}, func(*corev1.Service) error {
			if k := wait(pt.asked); k != 1 {
				return fmt.Errorf("the second page not asked for in 30 s (%d)", k)
			}
			return stop
		})
		if !errors.Is(err, stop) {
			t.Errorf("ListPages with each failing: %v, want %v", err, stop)
		}
		noReadAhead(t)
	})

	t.Run("cancelling ends the read ahead", func(t *testing.T) {
		c, pt := client(t)
		pt.answer = func(_ int, req *http.Request) (*http.Response, error) {
			<-req.Context().Done()
			return nil, req.Context().Err()
		}
		lctx, lcancel := context.WithCancel(ctx)
		defer lcancel()
		_, err := c.ListPages(lctx, metav1.ListOptions{Limit: 10}, Trim{}, func(*corev1.Service) error {
			if k := wait(pt.asked); k != 1 {
				return fmt.Errorf("the second page not asked for in 30 s (%d)", k)
			}
			// The agent stopping: the store's sends end with it.
			lcancel()
			return lctx.Err()
		})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("ListPages cancelled: %v", err)
		}
		if held := pagesHeld.Load(); held != 0 {
			t.Errorf("%d pages held once ListPages returned", held)
		}
		noReadAhead(t)
	})
}

// noReadAhead fails t when a goroutine of ListPages's read ahead is left:
// it may still be returning once it has handed over its page, so it is
// looked for until it is gone, for 10 s at most.
func noReadAhead(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		var left []string
		for _, g := range strings.Split(string(buf[:goruntime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "kubeclient.(*client[...]).ListPages.func") {
				left = append(left, g)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines of ListPages's read ahead are left:\n%s", len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pageTripper numbers the requests for the later pages of listings (those
// with a continue token, from 1), sends each number on asked as the
// request is sent and on read when its response's body has been read to
// its end, and answers with answer when it answers (returns a response
// or an error).
type pageTripper struct {
	next        http.RoundTripper
	asked, read chan int
	answer      func(k int, req *http.Request) (*http.Response, error)
	n           atomic.Int32
}

func (pt *pageTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	if !req.URL.Query().Has("continue") {
		return pt.next.RoundTrip(req)
	}
	k := int(pt.n.Add(1))
	pt.asked <- k
	if pt.answer != nil {
		if resp, err := pt.answer(k, req); resp != nil || err != nil {
			return resp, err
		}
	}
	resp, err := pt.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	resp.Body = &readBody{ReadCloser: resp.Body, done: func() { pt.read <- k }}
	return resp, nil
}

// readBody calls done when it is read to its end.
type readBody struct {
	io.ReadCloser
	done func()
	once sync.Once
}

func (b *readBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.once.Do(b.done)
	}
	return n, err
}

func mustHTTPClient(t *testing.T, cfg *rest.Config) *http.Client {
	t.Helper()
	c, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// BenchmarkTrim is the cost of trimming one listed object as the load
// balancer's listings do (a Service's metadata and selector).
func BenchmarkTrim(b *testing.B) {
	svc := testServices(3)[2]
	svc.UID, svc.ResourceVersion, svc.CreationTimestamp = "8d6f2a54-0b0e-4f3c-9c1e-2a8f1a3b7c11", "4711", metav1.Unix(1795900000, 0)
	svc.Spec.Selector = map[string]string{"app": "web"}
	data, err := svc.Marshal()
	if err != nil {
		b.Fatal(err)
	}
	trim := Trim{Labels: []string{}, NameOnly: true, NoSelector: true}.of("ServiceList")
	var scratch []byte
	b.ReportAllocs()
	for b.Loop() {
		_, scratch = trim.message(data, scratch)
	}
}
