// Package k8sclienttest stands in for the k8s-client cell in other cells'
// tests: Cell provides the embedded API server seeded with objects, and
// ScriptCommands writes objects to it from a script test's YAML files;
// WriteScaleManifests writes the scale benchmarks' Services and
// EndpointSlices.
//
//	h := hive.New(k8sclienttest.Cell(&corev1.Service{...}), myCell)
//
// Writes go through the *k8sclient.Fake's typed or generic clients, so
// watches see them as an API server's would.
package k8sclienttest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/pkg/kubeclient"
)

// Cell provides a k8sclient.Clientset backed by the embedded API server
// seeded with objects (Embedded() is true), and the *k8sclient.Fake itself
// so a test can create, update and delete objects.
func Cell(objects ...runtime.Object) cell.Cell {
	return cell.Module(
		"k8s-client",
		"Embedded Kubernetes API server for tests",

		cell.Provide(func() (out, error) {
			cs, fake, err := k8sclient.NewEmbedded(objects...)
			if err != nil {
				return out{}, fmt.Errorf("k8sclienttest.Cell: %w", err)
			}
			return out{Clientset: cs, Fake: fake}, nil
		}),
	)
}

type out struct {
	cell.Out

	Clientset k8sclient.Clientset
	Fake      *k8sclient.Fake
}

// ScriptCommands are k8s/add, k8s/update and k8s/delete FILE...: the
// objects of YAML files, of any kind kubeclient.Scheme knows, created,
// updated or deleted through the clientset cs returns. cs is called when a
// command runs: a script engine is made before the hive that makes the
// clientset has been populated.
func ScriptCommands(cs func() *k8sclient.Fake) map[string]script.Cmd {
	return map[string]script.Cmd{
		"k8s/add":    applyCmd("Create the objects of YAML files", cs, Create),
		"k8s/update": applyCmd("Update the objects of YAML files", cs, Update),
		"k8s/delete": applyCmd("Delete the objects of YAML files", cs, Delete),
	}
}

// Create, Update and Delete write obj through cs's reactors, as its typed
// clients would, whatever its kind. Namespaced objects without a namespace
// are in "default", as with kubectl.
func Create(cs *k8sclient.Fake, obj runtime.Object) error { return invoke(cs, "create", obj) }

func Update(cs *k8sclient.Fake, obj runtime.Object) error { return invoke(cs, "update", obj) }

func Delete(cs *k8sclient.Fake, obj runtime.Object) error { return invoke(cs, "delete", obj) }

// applyCmd does fn with each object of the YAML files it is given.
func applyCmd(summary string, cs func() *k8sclient.Fake, fn func(*k8sclient.Fake, runtime.Object) error) script.Cmd {
	return script.Command(
		script.CmdUsage{Summary: summary, Args: "file..."},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) == 0 {
				return nil, errors.New("want one or more YAML files")
			}
			for _, file := range args {
				objs, err := DecodeFile(s.Path(file))
				if err != nil {
					return nil, err
				}
				for _, obj := range objs {
					if err := fn(cs(), obj); err != nil {
						return nil, fmt.Errorf("%s: %w", file, err)
					}
				}
			}
			return nil, nil
		})
}

func invoke(cs *k8sclient.Fake, verb string, obj runtime.Object) error {
	gvr, namespaced, err := k8sclient.ResourceOf(obj)
	if err != nil {
		return err
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	req := kubeclient.Request{Verb: verb, Resource: gvr, Name: m.GetName()}
	if namespaced {
		if req.Namespace = m.GetNamespace(); req.Namespace == "" {
			req.Namespace = "default"
			m.SetNamespace(req.Namespace)
		}
	}
	if verb != "delete" {
		req.Object = obj
	}
	_, err = cs.Invoke(req)
	return err
}

// DecodeFile decodes the Kubernetes objects of a YAML file.
func DecodeFile(path string) ([]runtime.Object, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	objs, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return objs, nil
}

// Decode decodes the Kubernetes objects of a YAML stream.
func Decode(data []byte) ([]runtime.Object, error) {
	var objs []runtime.Object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := kubeclient.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return nil, err
		}
		objs = append(objs, obj)
	}
}
