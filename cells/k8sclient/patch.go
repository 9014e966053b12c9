package k8sclient

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cellium/cellium/pkg/kubeclient"
)

// The embedded API server's patches, on an object's JSON: what the agent's
// cells send, and no more (client-go's fake applied them with the
// strategic merge patch of k8s.io/apimachinery, which links the OpenAPI
// models and structured-merge-diff: see pkg/kubeclient).
//
//   - JSON patch (RFC 6902): add, remove, replace and test (the nodes
//     cell's test-and-replace of the taints); move and copy are refused.
//   - JSON merge patch (RFC 7386): the nodes cell's annotations.
//   - Strategic merge patch: a merge patch whose lists merge by key where
//     mergeKeys names one (the nodes cell's NetworkUnavailable condition,
//     merged into status.conditions by type). Any other list, and the
//     patch directives ($patch, $retainKeys, ...), are refused: without
//     the kinds' schemas a list cannot be known to be atomic.
//   - Server-side apply is refused.
//
// A refused patch is a BadRequest error naming what is not supported, and
// changes nothing. A JSON patch that cannot be applied (a path that is not
// there, a test that fails) is a 422 Invalid, as the API server answers it.

// mergeKeys are the lists a strategic merge patch merges, by their path
// from the object's root, and the key their items merge by. For every kind
// the embedded server holds (kubeclient.Scheme), status.conditions merges
// by type.
var mergeKeys = map[string]string{
	"status.conditions": "type",
}

// patch applies a patch request to the stored object, and stores and
// returns the patched object. A patch of a subresource patches the whole
// object, as client-go's fake did.
func (s *objectStore) patch(req kubeclient.Request) (runtime.Object, error) {
	current, err := s.Get(req.Resource, req.Namespace, req.Name)
	if err != nil {
		return nil, err
	}
	old, err := json.Marshal(current)
	if err != nil {
		return nil, err
	}
	patched, err := applyPatch(req.PatchType, old, req.Patch)
	if err != nil {
		msg := fmt.Sprintf("%s patch of %s %s: %v", req.PatchType, req.Resource.Resource, req.Name, err)
		if errors.As(err, new(unprocessable)) {
			// As the API server answers a JSON patch it decoded but
			// could not apply: 422, apierrors.IsInvalid.
			return nil, &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure,
				Code: http.StatusUnprocessableEntity, Reason: metav1.StatusReasonInvalid, Message: msg}}
		}
		return nil, apierrors.NewBadRequest(msg)
	}
	// Into a new object: unmarshalling into the old one would keep what
	// the patch removed.
	obj := reflect.New(reflect.TypeOf(current).Elem()).Interface().(runtime.Object)
	if err := json.Unmarshal(patched, obj); err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("%s patch of %s %s: the patched object: %v", req.PatchType, req.Resource.Resource, req.Name, err))
	}
	if err := s.add(req.Resource, obj, req.Namespace, true); err != nil {
		return nil, err
	}
	return obj, nil
}

// unprocessable is a patch that was decoded but cannot be applied to the
// object: a JSON patch's path that is not there, or its test that fails.
type unprocessable struct{ error }

func (u unprocessable) Unwrap() error { return u.error }

// applyPatch applies a patch of type pt to doc, a JSON object.
func applyPatch(pt types.PatchType, doc, patch []byte) ([]byte, error) {
	target, err := decodeJSON(doc)
	if err != nil {
		return nil, fmt.Errorf("the object: %w", err)
	}
	p, err := decodeJSON(patch)
	if err != nil {
		return nil, fmt.Errorf("the patch: %w", err)
	}
	switch pt {
	case types.JSONPatchType:
		target, err = jsonPatch(target, p)
	case types.MergePatchType:
		if _, ok := p.(map[string]any); !ok {
			return nil, fmt.Errorf("the patch is not a JSON object")
		}
		target = mergePatch(target, p)
	case types.StrategicMergePatchType:
		if _, ok := p.(map[string]any); !ok {
			return nil, fmt.Errorf("the patch is not a JSON object")
		}
		target, err = strategicMerge(target, p, "")
	default:
		return nil, fmt.Errorf("not supported by the embedded API server (it applies JSON, merge and strategic merge patches)")
	}
	if err != nil {
		return nil, err
	}
	return json.Marshal(target)
}

// decodeJSON decodes one JSON value, its numbers as they are written.
func decodeJSON(data []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, fmt.Errorf("more than one JSON value")
	}
	return v, nil
}

// mergePatch is RFC 7386: a patch's object members replace or (null)
// remove the target's, recursively; anything else replaces the target.
func mergePatch(target, patch any) any {
	p, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	t, ok := target.(map[string]any)
	if !ok {
		t = map[string]any{}
	}
	for k, v := range p {
		if v == nil {
			delete(t, k)
			continue
		}
		t[k] = mergePatch(t[k], v)
	}
	return t
}

// strategicMerge is a merge patch whose lists merge by mergeKeys; path is
// the patched value's, its members joined by dots.
func strategicMerge(target, patch any, path string) (any, error) {
	switch p := patch.(type) {
	case map[string]any:
		t, ok := target.(map[string]any)
		if !ok {
			t = map[string]any{}
		}
		for k, v := range p {
			at := k
			if path != "" {
				at = path + "." + k
			}
			if strings.HasPrefix(k, "$") {
				return nil, fmt.Errorf("directive %s (at %s): not supported by the embedded API server", k, at)
			}
			if v == nil {
				delete(t, k)
				continue
			}
			merged, err := strategicMerge(t[k], v, at)
			if err != nil {
				return nil, err
			}
			t[k] = merged
		}
		return t, nil
	case []any:
		key, ok := mergeKeys[path]
		if !ok {
			return nil, fmt.Errorf("list %s: the embedded API server merges only the lists %v", path, slices.Sorted(func(yield func(string) bool) {
				for k := range mergeKeys {
					if !yield(k) {
						return
					}
				}
			}))
		}
		return mergeList(target, p, path, key)
	}
	return patch, nil
}

// mergeList merges the items of patch into target's by their key: an item
// of the same key is merged into, others are appended.
func mergeList(target any, patch []any, path, key string) (any, error) {
	t, _ := target.([]any)
	out := slices.Clone(t)
	for i, item := range patch {
		m, ok := item.(map[string]any)
		if !ok || m[key] == nil {
			return nil, fmt.Errorf("list %s: item %d has no %q to merge by", path, i, key)
		}
		j := slices.IndexFunc(out, func(have any) bool {
			h, ok := have.(map[string]any)
			return ok && reflect.DeepEqual(h[key], m[key])
		})
		if j < 0 {
			out = append(out, nil)
			j = len(out) - 1
		}
		merged, err := strategicMerge(out[j], m, path+"[]")
		if err != nil {
			return nil, err
		}
		out[j] = merged
	}
	return out, nil
}

// jsonPatch applies the operations of an RFC 6902 patch in turn: all of
// them or, when one fails, none.
func jsonPatch(doc, patch any) (any, error) {
	ops, ok := patch.([]any)
	if !ok {
		return nil, fmt.Errorf("the patch is not a JSON array of operations")
	}
	for i, o := range ops {
		op, _ := o.(map[string]any)
		name, _ := op["op"].(string)
		path, ok := op["path"].(string)
		if !ok {
			return nil, fmt.Errorf("operation %d (%s): no path", i, name)
		}
		value, hasValue := op["value"]
		if !hasValue && (name == "add" || name == "replace" || name == "test") {
			return nil, fmt.Errorf("operation %d (%s %s): no value", i, name, path)
		}
		tokens, err := jsonPointer(path)
		if err != nil {
			return nil, fmt.Errorf("operation %d (%s): %w", i, name, err)
		}
		var leaf func(node any, token string) (any, error)
		switch name {
		case "add":
			leaf = func(node any, token string) (any, error) { return addAt(node, token, value) }
		case "remove":
			leaf = removeAt
		case "replace":
			leaf = func(node any, token string) (any, error) {
				if _, err := valueAt(node, token); err != nil {
					return nil, err
				}
				return setAt(node, token, value)
			}
		case "test":
			leaf = func(node any, token string) (any, error) {
				have, err := valueAt(node, token)
				if err != nil {
					return nil, err
				}
				if !jsonEqual(have, value) {
					return nil, fmt.Errorf("the value differs")
				}
				return node, nil
			}
		default:
			return nil, fmt.Errorf("operation %d (%q %s): not supported by the embedded API server (add, remove, replace, test)", i, name, path)
		}
		if len(tokens) == 0 {
			// The whole document.
			switch name {
			case "test":
				if !jsonEqual(doc, value) {
					return nil, unprocessable{fmt.Errorf("operation %d (test of the whole object): the value differs", i)}
				}
				continue
			case "add", "replace":
				doc = value
				continue
			}
			return nil, fmt.Errorf("operation %d (%s of the whole object): not supported", i, name)
		}
		if doc, err = editAt(doc, tokens, leaf); err != nil {
			return nil, unprocessable{fmt.Errorf("operation %d (%s %s): %w", i, name, path, err)}
		}
	}
	return doc, nil
}

// jsonEqual says whether two decoded JSON values are equal as RFC 6902's
// test compares them: numbers by value (1 and 1.0 are equal), objects by
// members, arrays item by item.
func jsonEqual(a, b any) bool {
	switch a := a.(type) {
	case json.Number:
		b, ok := b.(json.Number)
		if !ok {
			return false
		}
		x, okx := new(big.Rat).SetString(a.String())
		y, oky := new(big.Rat).SetString(b.String())
		return okx && oky && x.Cmp(y) == 0
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, v := range a {
			w, ok := b[k]
			if !ok || !jsonEqual(v, w) {
				return false
			}
		}
		return true
	case []any:
		b, ok := b.([]any)
		return ok && slices.EqualFunc(a, b, jsonEqual)
	default:
		// Strings, booleans and null.
		return a == b
	}
}

// jsonPointer is the reference tokens of an RFC 6901 pointer.
func jsonPointer(path string) ([]string, error) {
	if path == "" {
		return nil, nil
	}
	if !strings.HasPrefix(path, "/") {
		return nil, fmt.Errorf("path %q does not start with /", path)
	}
	tokens := strings.Split(path[1:], "/")
	for i, t := range tokens {
		tokens[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return tokens, nil
}

// editAt applies leaf to the container of the value tokens point to, and
// returns node with the container leaf returned in its place.
func editAt(node any, tokens []string, leaf func(node any, token string) (any, error)) (any, error) {
	if len(tokens) == 1 {
		return leaf(node, tokens[0])
	}
	child, err := valueAt(node, tokens[0])
	if err != nil {
		return nil, err
	}
	edited, err := editAt(child, tokens[1:], leaf)
	if err != nil {
		return nil, err
	}
	return setAt(node, tokens[0], edited)
}

// valueAt is the member or item token names of node.
func valueAt(node any, token string) (any, error) {
	switch n := node.(type) {
	case map[string]any:
		v, ok := n[token]
		if !ok {
			return nil, fmt.Errorf("no member %q", token)
		}
		return v, nil
	case []any:
		i, err := arrayIndex(token, len(n)-1)
		if err != nil {
			return nil, err
		}
		return n[i], nil
	}
	return nil, fmt.Errorf("no member %q: not an object or an array", token)
}

// setAt sets the member or item token names in node.
func setAt(node any, token string, value any) (any, error) {
	switch n := node.(type) {
	case map[string]any:
		n[token] = value
		return n, nil
	case []any:
		i, err := arrayIndex(token, len(n)-1)
		if err != nil {
			return nil, err
		}
		n[i] = value
		return n, nil
	}
	return nil, fmt.Errorf("cannot set %q: not an object or an array", token)
}

// addAt adds the member or item token names to node: an item is
// inserted, "-" appending it.
func addAt(node any, token string, value any) (any, error) {
	n, ok := node.([]any)
	if !ok {
		return setAt(node, token, value)
	}
	if token == "-" {
		return append(n, value), nil
	}
	i, err := arrayIndex(token, len(n))
	if err != nil {
		return nil, err
	}
	return slices.Insert(n, i, value), nil
}

func removeAt(node any, token string) (any, error) {
	switch n := node.(type) {
	case map[string]any:
		if _, ok := n[token]; !ok {
			return nil, fmt.Errorf("no member %q", token)
		}
		delete(n, token)
		return n, nil
	case []any:
		i, err := arrayIndex(token, len(n)-1)
		if err != nil {
			return nil, err
		}
		return slices.Delete(n, i, i+1), nil
	}
	return nil, fmt.Errorf("cannot remove %q: not an object or an array", token)
}

// arrayIndex is token as an index from 0 to most.
func arrayIndex(token string, most int) (int, error) {
	i, err := strconv.Atoi(token)
	if err != nil || i < 0 || i > most || (len(token) > 1 && token[0] == '0') {
		return 0, fmt.Errorf("no item %q", token)
	}
	return i, nil
}
