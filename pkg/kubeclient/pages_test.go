package kubeclient

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/cellium/cellium/pkg/etcdtest"
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
	meta, err := eachItem(data[len(protobufPrefix):], "ServiceList", &corev1.Service{}, func(s *corev1.Service) error {
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
		// The objects of a list are encoded without their kind.
		want.Items[i].TypeMeta = metav1.TypeMeta{}
	}
	if !equality.Semantic.DeepEqual(got, want.Items) {
		t.Errorf("decoded %d objects\n%+v\nwant %d\n%+v", len(got), got, len(want.Items), want.Items)
	}

	// An error of each stops the page with it.
	stop := fmt.Errorf("stop")
	n := 0
	if _, err := eachItem(data[len(protobufPrefix):], "ServiceList", &corev1.Service{}, func(*corev1.Service) error { n++; return stop }); err == nil || !strings.Contains(err.Error(), "stop") || n != 1 {
		t.Errorf("each failing: %v after %d objects, want its error after 1", err, n)
	}
}

// A page that is not the list asked for, or is cut short, is an error
// naming what was wanted and what came.
func TestEachItemRejectsBadPages(t *testing.T) {
	slices := encode(t, &discoveryv1.EndpointSliceList{TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSliceList"}})
	_, err := eachItem(slices[len(protobufPrefix):], "ServiceList", &corev1.Service{}, func(*corev1.Service) error { return nil })
	if err == nil || !strings.Contains(err.Error(), `got a "EndpointSliceList", want a ServiceList`) {
		t.Errorf("an EndpointSliceList read as a ServiceList: %v", err)
	}
	data := encode(t, &corev1.ServiceList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceList"}, Items: testServices(3)})
	for _, cut := range []int{len(data) - 1, len(data) / 2, len(protobufPrefix) + 3} {
		_, err := eachItem(data[len(protobufPrefix):cut], "ServiceList", &corev1.Service{}, func(*corev1.Service) error { return nil })
		if err == nil {
			t.Errorf("a page cut at %d of %d bytes decoded without an error", cut, len(data))
		}
	}
}

// A fake's client lists each object of its List.
func TestListEachOfFake(t *testing.T) {
	fake := &k8stesting.Fake{}
	fake.AddReactor("list", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, &corev1.ServiceList{ListMeta: metav1.ListMeta{ResourceVersion: "7"}, Items: testServices(3)}, nil
	})
	c := New(NewFakeSource(fake, corev1.SchemeGroupVersion), "services", "Service", "", func(l *corev1.ServiceList) *[]corev1.Service { return &l.Items })
	var names []string
	meta, err := c.ListEach(context.Background(), metav1.ListOptions{}, func(s *corev1.Service) error {
		names = append(names, s.Name)
		return nil
	})
	if err != nil || meta.ResourceVersion != "7" || fmt.Sprint(names) != "[svc-0 svc-1 svc-2]" {
		t.Errorf("ListEach of a fake: %v %q %v", err, meta.ResourceVersion, names)
	}
}

// Against a real kube-apiserver, ListEach's pages hold the objects List
// has, in protobuf (and in JSON, when the client asks for it), and their
// continue tokens lead through the listing.
func TestListEachOfAPIServer(t *testing.T) {
	if _, err := kubeapitest.Binary(); err != nil {
		t.Skip(err)
	}
	kas := kubeapitest.Start(t, etcdtest.Start(t).Endpoint())
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
		var got []corev1.Service
		opts := metav1.ListOptions{Limit: 10}
		pages := 0
		for {
			meta, err := c.ListEach(ctx, opts, func(s *corev1.Service) error {
				got = append(got, *s.DeepCopy())
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			pages++
			if meta.Continue == "" {
				if meta.ResourceVersion == "" {
					t.Error("the last page has no resource version")
				}
				break
			}
			opts.Continue = meta.Continue
		}
		// n and the API server's own, default/kubernetes.
		if len(want.Items) != n+1 || pages != 3 || !equality.Semantic.DeepEqual(got, want.Items) {
			t.Errorf("content type %q: ListEach in %d pages gave %d objects, List %d; equal: %v", contentType, pages, len(got), len(want.Items), equality.Semantic.DeepEqual(got, want.Items))
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
	}
}

func mustHTTPClient(t *testing.T, cfg *rest.Config) *http.Client {
	t.Helper()
	c, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
