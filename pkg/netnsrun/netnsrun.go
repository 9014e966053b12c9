// Package netnsrun runs functions in another network namespace, on a
// thread of their own: the agent's cells that watch or change another
// namespace (--devices-netns), the dev-cluster, and the tests.
//
// The calling goroutine's thread is locked, moved into the namespace, and
// moved back when the function returns. Should the move back fail, the
// thread stays locked and the runtime ends it with its goroutine, rather
// than run other goroutines in the wrong namespace.
package netnsrun

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// Do runs fn on a thread in the network namespace at path. What fn creates
// there (sockets, processes it starts) stays in that namespace.
func Do(path string, fn func() error) error {
	target, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer target.Close()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter netns %s: %w", path, err)
	}
	fnErr := fn()
	if err := netns.Set(orig); err != nil {
		return fmt.Errorf("leave netns %s: %w", path, err)
	}
	runtime.UnlockOSThread()
	return fnErr
}

// In runs fn as Do does and returns its result: a listener fn makes stays
// in that namespace wherever it is used later.
func In[T any](path string, fn func() (T, error)) (T, error) {
	var v T
	err := Do(path, func() (err error) {
		v, err = fn()
		return err
	})
	return v, err
}
