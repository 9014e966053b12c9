package k8sclient

import (
	"slices"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// A decoder of the JSON the fast YAML path makes into the two kinds a
// large directory is made of, Services and EndpointSlices, for the fields
// manifests of them usually have. It is the codec's strict decoding
// without reflection: most of a large directory's decoding was the
// codec's. It declines, and the codec decodes the document (and gives any
// error), on anything it does not know: another field, a duplicate key, a
// null, an escape in a string, a number that is not a plain int32, bytes
// that are not UTF-8. What it accepts, it decodes to the object the codec
// makes (FuzzFastTyped holds it to that).

var (
	serviceGVK       = corev1.SchemeGroupVersion.WithKind("Service")
	endpointSliceGVK = discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice")
)

// decodeFastTyped decodes js into a new object of kind gvk, if this
// decoder knows the kind and every field of js.
func decodeFastTyped(js []byte, gvk schema.GroupVersionKind) (runtime.Object, bool) {
	r := &jsonReader{b: js}
	var obj runtime.Object
	switch gvk {
	case serviceGVK:
		obj = r.service()
	case endpointSliceGVK:
		obj = r.endpointSlice()
	default:
		return nil, false
	}
	r.ws()
	if r.bad || r.i != len(r.b) {
		return nil, false
	}
	return obj, true
}

// jsonReader reads JSON strictly; bad is set at the first thing it does
// not accept, and everything read after is to be thrown away.
type jsonReader struct {
	b   []byte
	i   int
	bad bool
}

func (r *jsonReader) ws() {
	for r.i < len(r.b) {
		switch r.b[r.i] {
		case ' ', '\t', '\n', '\r':
			r.i++
		default:
			return
		}
	}
}

// next skips whitespace and returns the next byte, 0 at the end.
func (r *jsonReader) next() byte {
	r.ws()
	if r.bad || r.i >= len(r.b) {
		r.bad = true
		return 0
	}
	return r.b[r.i]
}

func (r *jsonReader) expect(c byte) {
	if r.next() != c {
		r.bad = true
		return
	}
	r.i++
}

// raw reads a string without escapes, as the bytes between its quotes.
func (r *jsonReader) raw() []byte {
	r.expect('"')
	if r.bad {
		return nil
	}
	start := r.i
	for r.i < len(r.b) {
		c := r.b[r.i]
		switch {
		case c == '"':
			s := r.b[start:r.i]
			r.i++
			if !utf8.Valid(s) {
				r.bad = true
			}
			return s
		case c == '\\' || c < 0x20:
			r.bad = true
			return nil
		}
		r.i++
	}
	r.bad = true
	return nil
}

func (r *jsonReader) str() string { return string(r.raw()) }

func (r *jsonReader) strPtr() *string {
	s := r.str()
	return &s
}

// int32 reads an integer in int32's range: no fraction, no exponent.
func (r *jsonReader) int32() int32 {
	r.next()
	if r.bad {
		return 0
	}
	neg := r.b[r.i] == '-'
	if neg {
		r.i++
	}
	start := r.i
	var v int64
	for r.i < len(r.b) && r.b[r.i] >= '0' && r.b[r.i] <= '9' {
		v = v*10 + int64(r.b[r.i]-'0')
		r.i++
		if v > 1<<31 {
			r.bad = true
			return 0
		}
	}
	n := r.i - start
	switch {
	case n == 0, n > 1 && r.b[start] == '0':
		r.bad = true
	case r.i < len(r.b) && (r.b[r.i] == '.' || r.b[r.i] == 'e' || r.b[r.i] == 'E'):
		r.bad = true
	}
	if neg {
		v = -v
	}
	if v > 1<<31-1 || v < -1<<31 {
		r.bad = true
	}
	return int32(v)
}

func (r *jsonReader) int32Ptr() *int32 {
	v := r.int32()
	return &v
}

func (r *jsonReader) boolPtr() *bool {
	var v bool
	switch {
	case r.next() == 't' && r.literal("true"):
		v = true
	case r.next() == 'f' && r.literal("false"):
	default:
		r.bad = true
	}
	return &v
}

func (r *jsonReader) literal(word string) bool {
	if len(r.b)-r.i < len(word) || string(r.b[r.i:r.i+len(word)]) != word {
		return false
	}
	r.i += len(word)
	return true
}

// object reads an object, calling field for each key; field reads the
// value, or sets r.bad for a key it does not know. A key seen twice is
// refused: fields names them, its bits say which were seen.
func (r *jsonReader) object(fields []string, field func(i int)) {
	r.expect('{')
	if r.next() == '}' {
		r.i++
		return
	}
	var seen uint64
	for !r.bad {
		key := r.raw()
		r.expect(':')
		i := fieldIndex(fields, key)
		if i < 0 || seen&(1<<i) != 0 {
			r.bad = true
			return
		}
		seen |= 1 << i
		field(i)
		switch r.next() {
		case ',':
			r.i++
		case '}':
			r.i++
			return
		default:
			r.bad = true
		}
	}
}

func fieldIndex(fields []string, key []byte) int {
	for i, f := range fields {
		if f == string(key) {
			return i
		}
	}
	return -1
}

// array reads an array, calling elem to read each element.
func (r *jsonReader) array(elem func()) {
	r.expect('[')
	if r.next() == ']' {
		r.i++
		return
	}
	for !r.bad {
		elem()
		switch r.next() {
		case ',':
			r.i++
		case ']':
			r.i++
			return
		default:
			r.bad = true
		}
	}
}

// readArray reads an array whose elements elem reads, each into a new
// zero element; [] is an empty slice, as the codec makes it.
func readArray[T any](r *jsonReader, elem func(*T)) []T {
	out := []T{}
	r.array(func() {
		var zero T
		out = append(out, zero)
		elem(&out[len(out)-1])
	})
	return out
}

func readStrings[T ~string](r *jsonReader) []T {
	return readArray(r, func(s *T) { *s = T(r.str()) })
}

// stringMap reads an object of strings; a key twice is refused.
func (r *jsonReader) stringMap() map[string]string {
	out := map[string]string{}
	r.expect('{')
	if r.next() == '}' {
		r.i++
		return out
	}
	for !r.bad {
		key := r.str()
		r.expect(':')
		if _, dup := out[key]; dup {
			r.bad = true
			return out
		}
		out[key] = r.str()
		switch r.next() {
		case ',':
			r.i++
		case '}':
			r.i++
			return out
		default:
			r.bad = true
		}
	}
	return out
}

var objectMetaFields = []string{"name", "namespace", "labels", "annotations"}

func (r *jsonReader) objectMeta(m *metav1.ObjectMeta) {
	r.object(objectMetaFields, func(i int) {
		switch i {
		case 0:
			m.Name = r.str()
		case 1:
			m.Namespace = r.str()
		case 2:
			m.Labels = r.stringMap()
		case 3:
			m.Annotations = r.stringMap()
		}
	})
}

// headerFields are the fields every object starts with: header reads them
// and the kinds' own fields come after, from index len(headerFields) on.
var headerFields = []string{"apiVersion", "kind", "metadata"}

// header reads field i if it is one of headerFields, and says whether it
// was.
func (r *jsonReader) header(i int, tm *metav1.TypeMeta, om *metav1.ObjectMeta) bool {
	switch i {
	case 0:
		tm.APIVersion = r.str()
	case 1:
		tm.Kind = r.str()
	case 2:
		r.objectMeta(om)
	default:
		return false
	}
	return true
}

var serviceFields = append(slices.Clip(headerFields), "spec")

func (r *jsonReader) service() *corev1.Service {
	svc := &corev1.Service{}
	r.object(serviceFields, func(i int) {
		if !r.header(i, &svc.TypeMeta, &svc.ObjectMeta) {
			r.serviceSpec(&svc.Spec)
		}
	})
	return svc
}

var serviceSpecFields = []string{
	"type", "clusterIP", "clusterIPs", "selector", "ports", "externalIPs",
	"sessionAffinity", "externalTrafficPolicy", "internalTrafficPolicy",
	"ipFamilies", "ipFamilyPolicy", "healthCheckNodePort", "loadBalancerIP",
	"publishNotReadyAddresses", "allocateLoadBalancerNodePorts", "externalName",
}

func (r *jsonReader) serviceSpec(s *corev1.ServiceSpec) {
	r.object(serviceSpecFields, func(i int) {
		switch i {
		case 0:
			s.Type = corev1.ServiceType(r.str())
		case 1:
			s.ClusterIP = r.str()
		case 2:
			s.ClusterIPs = readStrings[string](r)
		case 3:
			s.Selector = r.stringMap()
		case 4:
			s.Ports = readArray(r, r.servicePort)
		case 5:
			s.ExternalIPs = readStrings[string](r)
		case 6:
			s.SessionAffinity = corev1.ServiceAffinity(r.str())
		case 7:
			s.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicy(r.str())
		case 8:
			p := corev1.ServiceInternalTrafficPolicy(r.str())
			s.InternalTrafficPolicy = &p
		case 9:
			s.IPFamilies = readStrings[corev1.IPFamily](r)
		case 10:
			p := corev1.IPFamilyPolicy(r.str())
			s.IPFamilyPolicy = &p
		case 11:
			s.HealthCheckNodePort = r.int32()
		case 12:
			s.LoadBalancerIP = r.str()
		case 13:
			s.PublishNotReadyAddresses = *r.boolPtr()
		case 14:
			s.AllocateLoadBalancerNodePorts = r.boolPtr()
		case 15:
			s.ExternalName = r.str()
		}
	})
}

var servicePortFields = []string{"name", "protocol", "port", "targetPort", "nodePort", "appProtocol"}

func (r *jsonReader) servicePort(p *corev1.ServicePort) {
	r.object(servicePortFields, func(i int) {
		switch i {
		case 0:
			p.Name = r.str()
		case 1:
			p.Protocol = corev1.Protocol(r.str())
		case 2:
			p.Port = r.int32()
		case 3:
			if r.next() == '"' {
				p.TargetPort = intstr.FromString(r.str())
			} else {
				p.TargetPort = intstr.FromInt32(r.int32())
			}
		case 4:
			p.NodePort = r.int32()
		case 5:
			p.AppProtocol = r.strPtr()
		}
	})
}

var endpointSliceFields = append(slices.Clip(headerFields), "addressType", "endpoints", "ports")

func (r *jsonReader) endpointSlice() *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{}
	r.object(endpointSliceFields, func(i int) {
		if r.header(i, &s.TypeMeta, &s.ObjectMeta) {
			return
		}
		switch i {
		case 3:
			s.AddressType = discoveryv1.AddressType(r.str())
		case 4:
			s.Endpoints = readArray(r, r.endpoint)
		case 5:
			s.Ports = readArray(r, r.endpointPort)
		}
	})
	return s
}

var endpointFields = []string{"addresses", "conditions", "nodeName", "zone", "hostname"}

func (r *jsonReader) endpoint(e *discoveryv1.Endpoint) {
	r.object(endpointFields, func(i int) {
		switch i {
		case 0:
			e.Addresses = readStrings[string](r)
		case 1:
			r.object(endpointConditionsFields, func(i int) {
				switch i {
				case 0:
					e.Conditions.Ready = r.boolPtr()
				case 1:
					e.Conditions.Serving = r.boolPtr()
				case 2:
					e.Conditions.Terminating = r.boolPtr()
				}
			})
		case 2:
			e.NodeName = r.strPtr()
		case 3:
			e.Zone = r.strPtr()
		case 4:
			e.Hostname = r.strPtr()
		}
	})
}

var endpointConditionsFields = []string{"ready", "serving", "terminating"}

var endpointPortFields = []string{"name", "port", "protocol", "appProtocol"}

func (r *jsonReader) endpointPort(p *discoveryv1.EndpointPort) {
	r.object(endpointPortFields, func(i int) {
		switch i {
		case 0:
			p.Name = r.strPtr()
		case 1:
			p.Port = r.int32Ptr()
		case 2:
			proto := corev1.Protocol(r.str())
			p.Protocol = &proto
		case 3:
			p.AppProtocol = r.strPtr()
		}
	})
}
