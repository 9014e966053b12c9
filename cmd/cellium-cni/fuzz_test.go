package main

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// A network configuration is refused with a CNI error of code 1, 6 or 7,
// or is one for this plugin with an absolute socket.
func FuzzConf(f *testing.F) {
	for _, s := range []string{
		`{"cniVersion":"1.0.0","name":"cellium","type":"cellium-cni"}`,
		`{"cniVersion":"1.1.0","name":"cellium","type":"cellium-cni","socket":"/var/run/cellium/agent.sock"}`,
		`{"cniVersion":"1.0.0","name":"cellium"}`,
		`{"cniVersion":"1.0.0","name":"cellium","type":"bridge"}`,
		`{"cniVersion":"1.0.0","name":"cellium","type":"cellium-cni","socket":"agent.sock"}`,
		`{"cniVersion":"1.0.0","name":"cellium","type":"cellium-cni","socket":7}`,
		`{"cniVersion":"1.0.0","name":"cellium","type":"cellium-cni","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.1/32"}]}}`,
		`{"cniVersion":"1.0.0","name":"cellium","type":"cellium-cni","prevResult":{"cniVersion":"9"}}`,
		"{not json",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, stdin []byte) {
		conf, _, err := parseConf(stdin)
		if err != nil {
			cniErr, ok := errors.AsType[*pluginError](err)
			if !ok || cniErr.Code != errIncompatibleCNIVersion && cniErr.Code != errDecodingFailure && cniErr.Code != errInvalidNetworkConfig {
				t.Fatalf("error %v (%T) is not a CNI error of code 1, 6 or 7", err, err)
			}
			return
		}
		if conf.Type != "cellium-cni" || !filepath.IsAbs(conf.Socket) {
			t.Fatalf("accepted type %q, socket %q", conf.Type, conf.Socket)
		}
	})
}

// CNI_ARGS are refused with code 4, or give the pod's namespace and name
// as they are written in them.
func FuzzArgs(f *testing.F) {
	for _, s := range []string{
		"",
		"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc",
		"K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0",
		"K8S_POD_NAME=a=b",
		"UNKNOWN=1",
		";;;",
		"K8S_POD_NAME",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, cniArgs string) {
		k8s, err := parseArgs(cniArgs)
		if err != nil {
			if cniErr, ok := errors.AsType[*pluginError](err); !ok || cniErr.Code != errInvalidEnvironmentVariables {
				t.Fatalf("error %v (%T) is not a CNI error of code 4", err, err)
			}
			return
		}
		for key, v := range map[string]string{"K8S_POD_NAMESPACE": k8s.K8S_POD_NAMESPACE, "K8S_POD_NAME": k8s.K8S_POD_NAME, "K8S_POD_UID": k8s.K8S_POD_UID} {
			if v != "" && !strings.Contains(cniArgs, key+"="+v) {
				t.Fatalf("%s %q is not in CNI_ARGS %q", key, v, cniArgs)
			}
			if strings.Contains(v, ";") {
				t.Fatalf("%s %q holds a separator", key, v)
			}
		}
	})
}
