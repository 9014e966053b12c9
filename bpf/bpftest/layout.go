// Package bpftest holds test helpers for the bpf/ objects: loading them
// (Load), and comparing the Go mirrors of their C types with their BTF.
package bpftest

import (
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// CompareMap compares a map's key and value with their Go types: the BTF
// layouts, as CompareLayout does, and the sizes the map spec declares.
func CompareMap(t testing.TB, name string, m *ebpf.MapSpec, key, value reflect.Type) {
	t.Helper()
	CompareLayout(t, name+" key", m.Key, key)
	CompareLayout(t, name+" value", m.Value, value)
	if want := uint32(key.Size()); m.KeySize != want {
		t.Errorf("%s: key size %d in the object, %d in Go", name, m.KeySize, want)
	}
	if want := uint32(value.Size()); m.ValueSize != want {
		t.Errorf("%s: value size %d in the object, %d in Go", name, m.ValueSize, want)
	}
}

// CompareLayout compares a Go type with the BTF of its C type: size, and
// for structs each field's offset, size and name (C's snake_case against
// Go's CamelCase; Go's blank fields against C's pad fields), so that two
// fields swapped in one language fail too. what names the type in errors.
func CompareLayout(t testing.TB, what string, typ btf.Type, goType reflect.Type) {
	t.Helper()
	if typ == nil {
		t.Errorf("%s: no BTF type", what)
		return
	}
	size, err := btf.Sizeof(typ)
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	if size != int(goType.Size()) {
		t.Errorf("%s: %d bytes in C (%v), %d in Go (%v)", what, size, typ, goType.Size(), goType)
		return
	}
	st, isStruct := btf.UnderlyingType(typ).(*btf.Struct)
	if isStruct != (goType.Kind() == reflect.Struct) {
		t.Errorf("%s: C type %v and Go type %v are not both structs", what, typ, goType)
		return
	}
	if !isStruct {
		return
	}
	if len(st.Members) != goType.NumField() {
		t.Errorf("%s: %d fields in C (%v), %d in Go (%v)", what, len(st.Members), st, goType.NumField(), goType)
		return
	}
	for i, m := range st.Members {
		f := goType.Field(i)
		msize, err := btf.Sizeof(m.Type)
		if err != nil {
			t.Errorf("%s.%s: %v", what, m.Name, err)
			continue
		}
		if int(m.Offset.Bytes()) != int(f.Offset) || msize != int(f.Type.Size()) {
			t.Errorf("%s: C field %s at %d (%d bytes), Go field %s at %d (%d bytes)",
				what, m.Name, m.Offset.Bytes(), msize, f.Name, f.Offset, f.Type.Size())
		}
		if !sameName(m.Name, f.Name) {
			t.Errorf("%s: field %d is %s in C, %s in Go", what, i, m.Name, f.Name)
		}
	}
}

func sameName(c, goName string) bool {
	if goName == "_" {
		return strings.HasPrefix(c, "pad")
	}
	return strings.EqualFold(strings.ReplaceAll(c, "_", ""), goName)
}
