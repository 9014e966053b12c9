package policy_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/k8sclient/k8sclienttest"
)

// TestSidecarNamedPorts: a named port of a sidecar (an init container
// with restartPolicy Always, running beside the app) is the pod's, for
// ingress on a local pod and for egress to a remote one; the port of an
// init container that ends before the pod serves is not.
func TestSidecarNamedPorts(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	tcp := func(name string, port int32) []corev1.ContainerPort {
		return []corev1.ContainerPort{{Name: name, ContainerPort: port, Protocol: corev1.ProtocolTCP}}
	}
	pod := func(name, node string, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: name, Labels: labels},
			Spec: corev1.PodSpec{NodeName: node,
				InitContainers: []corev1.Container{
					{Name: "setup", Ports: tcp("setup", 7000)},
					{Name: "proxy", RestartPolicy: &always, Ports: tcp("proxy", 15001)},
				},
				Containers: []corev1.Container{{Name: "app", Ports: tcp("http", 8080)}}},
		}
	}
	web, db := map[string]string{"app": "web"}, map[string]string{"app": "db"}
	a := start(t, pod("web", nodeName, web), pod("db-0", "node2", db))
	a.addIdentity(1001, "prod", web, nil)
	a.addIdentity(1002, "prod", db, nil)
	a.addIdentity(1003, "prod", map[string]string{"app": "client"}, nil)
	a.addEndpoint(&endpointmanager.Endpoint{ID: 1, PodNamespace: "prod", PodName: "web", Labels: web, Identity: 1001})

	client := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}
	// "setup" names the ended init container's port: it matches nothing
	// (the policy is reported, the rest of it applies).
	in := ingressFrom(client, portOf(intstr.FromString("proxy")), portOf(intstr.FromString("http")), portOf(intstr.FromString("setup")))
	in.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	in.Egress = []networkingv1.NetworkPolicyEgressRule{{
		To:    []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: db}}},
		Ports: []networkingv1.NetworkPolicyPort{portOf(intstr.FromString("proxy")), portOf(intstr.FromString("setup"))},
	}}
	if err := k8sclienttest.Create(a.cs, netpol("mesh", in)); err != nil {
		t.Fatal(err)
	}
	a.waitEntries(1,
		"egress 1002 6 15001-0 prod/mesh",
		"ingress 1 0 0-0 reserved:host",
		"ingress 1003 6 15001-0 prod/mesh",
		"ingress 1003 6 8080-0 prod/mesh")
}
