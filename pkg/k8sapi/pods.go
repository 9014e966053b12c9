package k8sapi

import corev1 "k8s.io/api/core/v1"

// NamedPortContainers are the containers of pod that serve beside its
// app, with only their names and named ports, those with no named port
// left out: what an informer keeps of a pod for the named ports that
// NetworkPolicies and CelliumEndpoint objects name. They are its sidecars
// (init containers with restartPolicy Always, which keep running once the
// pod has started), first, and its containers. The other init containers
// have ended before the pod serves: their ports are not the pod's.
func NamedPortContainers(pod *corev1.Pod) []corev1.Container {
	var out []corev1.Container
	add := func(c *corev1.Container) {
		var ports []corev1.ContainerPort
		for _, p := range c.Ports {
			if p.Name != "" {
				ports = append(ports, corev1.ContainerPort{Name: p.Name, ContainerPort: p.ContainerPort, Protocol: p.Protocol})
			}
		}
		if ports != nil {
			out = append(out, corev1.Container{Name: c.Name, Ports: ports})
		}
	}
	for i := range pod.Spec.InitContainers {
		if c := &pod.Spec.InitContainers[i]; c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			add(c)
		}
	}
	for i := range pod.Spec.Containers {
		add(&pod.Spec.Containers[i])
	}
	return out
}
