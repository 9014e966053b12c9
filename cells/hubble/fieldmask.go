package hubble

import (
	"fmt"
	"strings"

	"github.com/cilium/cilium/api/v1/flow"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

// flowMask keeps only some fields of flows: GetFlows' field_mask, paths
// such as "source.pod_name" relative to flow.Flow.
type flowMask [][]protoreflect.FieldDescriptor

// newFlowMask resolves a field mask's paths against flow.Flow; nil or empty
// means whole flows.
func newFlowMask(m *fieldmaskpb.FieldMask) (flowMask, error) {
	if len(m.GetPaths()) == 0 {
		return nil, nil
	}
	if !m.IsValid(&flow.Flow{}) {
		return nil, fmt.Errorf("invalid field_mask %v: every path must name fields of flow.Flow, such as source.pod_name", m.GetPaths())
	}
	// Normalized paths do not overlap, so projecting one never writes into
	// a sub-message that another path copied from the original flow.
	m = proto.Clone(m).(*fieldmaskpb.FieldMask)
	m.Normalize()
	var mask flowMask
	for _, p := range m.GetPaths() {
		var fds []protoreflect.FieldDescriptor
		desc := (&flow.Flow{}).ProtoReflect().Descriptor()
		for name := range strings.SplitSeq(p, ".") {
			fd := desc.Fields().ByName(protoreflect.Name(name))
			fds = append(fds, fd)
			desc = fd.Message()
		}
		mask = append(mask, fds)
	}
	return mask, nil
}

// apply is a new flow with only the masked fields of f; f is not changed.
func (m flowMask) apply(f *flow.Flow) *flow.Flow {
	out := &flow.Flow{}
	for _, path := range m {
		copyPath(f.ProtoReflect(), out.ProtoReflect(), path)
	}
	return out
}

func copyPath(src, dst protoreflect.Message, path []protoreflect.FieldDescriptor) {
	fd := path[0]
	if !src.Has(fd) {
		return
	}
	if len(path) == 1 {
		dst.Set(fd, src.Get(fd))
		return
	}
	copyPath(src.Get(fd).Message(), dst.Mutable(fd).Message(), path[1:])
}
