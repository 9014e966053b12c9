package health

import (
	"slices"
	"strings"

	"github.com/cilium/hive/cell"

	"github.com/cellium/cellium/pkg/apiv1"
)

// buildTree turns the flat rows of the health table into one tree per
// module. A node's level is the worst of its own and its descendants', except
// that a node that never reported itself (Unknown) but has children takes its
// children's level: modules rarely report, their jobs do.
func buildTree(rows []*Status) (nodes []apiv1.HealthNode, worst cell.Level) {
	type node struct {
		apiv1.HealthNode
		own      cell.Level
		children map[string]*node
	}
	root := &node{own: cell.StatusUnknown, children: map[string]*node{}}
	for _, st := range rows {
		n := root
		for i, name := range st.Path {
			child, ok := n.children[name]
			if !ok {
				child = &node{
					HealthNode: apiv1.HealthNode{Name: name, ID: strings.Join(st.Path[:i+1], ".")},
					own:        cell.StatusUnknown,
					children:   map[string]*node{},
				}
				n.children[name] = child
			}
			n = child
		}
		n.own = st.Level
		n.Message, n.Error, n.Since = st.Message, st.Error, st.Since
	}

	var finish func(n *node) (apiv1.HealthNode, cell.Level)
	finish = func(n *node) (apiv1.HealthNode, cell.Level) {
		level := n.own
		if level == cell.StatusUnknown && len(n.children) > 0 {
			level = cell.StatusStopped // the most healthy, raised by the children
		}
		out := n.HealthNode
		for _, name := range sortedKeys(n.children) {
			child, childLevel := finish(n.children[name])
			out.Children = append(out.Children, child)
			if severity(childLevel) > severity(level) {
				level = childLevel
			}
		}
		out.Level = string(level)
		return out, level
	}
	top, worst := finish(root)
	if len(top.Children) == 0 {
		worst = cell.StatusUnknown
	}
	return top.Children, worst
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
