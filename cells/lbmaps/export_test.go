package lbmaps

import "github.com/cellium/cellium/cells/loadbalancer"

// WhileReconciling runs fn while p, lb-maps' Programmed, is held as a
// reconciliation round holds it.
func WhileReconciling(p loadbalancer.Programmed, fn func()) {
	o := p.(*ops)
	o.mu.Lock()
	defer o.mu.Unlock()
	fn()
}
