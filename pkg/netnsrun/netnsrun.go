// Package netnsrun makes network namespaces kept at a path by a bind mount
// (as `ip netns add` does), runs functions in them, and removes them: the
// one helper the agent's cells (the health endpoint, --devices-netns), the
// dev-cluster and the tests share.
//
// Contract:
//   - Do and In run fn on a goroutine of their own whose thread is locked
//     and moved into the namespace; the caller's thread never moves. What fn
//     creates there (sockets, processes it forks) stays in that namespace
//     wherever it is used later.
//   - The thread goes back to its namespace when fn returns. Should that
//     fail, Do says so and leaves the thread locked, so the runtime ends it
//     with its goroutine rather than run other code in the wrong namespace.
//   - Create makes a namespace with lo up at a path that must not exist;
//     Remove unmounts and removes it, and a path that is not there is no
//     error. The namespace itself goes once nothing else holds it.
//
// Opening and entering namespaces is containernetworking's ns package;
// this package adds the path lifecycle and the checked way back.
//
//	if err := netnsrun.Create(path); err != nil { ... }
//	ln, err := netnsrun.In(path, func() (net.Listener, error) { return net.Listen("tcp", ":4240") })
//	...
//	err = netnsrun.Remove(path)
package netnsrun

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Do runs fn on a locked thread in the network namespace at path.
func Do(path string, fn func() error) error {
	target, err := ns.GetNS(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := ns.GetCurrentNS()
		if err != nil {
			errc <- fmt.Errorf("open this thread's netns: %w", err)
			return
		}
		defer orig.Close()
		if err := target.Set(); err != nil {
			// setns failed: the thread is where it was.
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns %s: %w", path, err)
			return
		}
		fnErr := fn()
		if err := orig.Set(); err != nil {
			errc <- errors.Join(fnErr, fmt.Errorf("leave netns %s: %w", path, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- fnErr
	}()
	return <-errc
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

// Exists says whether path is a mounted network namespace (a namespace
// file, not the plain file a bind mount leaves behind after a reboot).
func Exists(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// Create makes a network namespace kept alive by a bind mount at path,
// with lo up, making path's directory if needed. It fails if path exists.
func Create(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create netns %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("create netns %s: %w", path, err)
	}
	f.Close()
	fresh, err := ns.TempNetNS()
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("create netns %s: %w", path, err)
	}
	defer fresh.Close()
	if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", fresh.Fd()), path, "none", unix.MS_BIND, ""); err != nil {
		os.Remove(path)
		return fmt.Errorf("create netns %s: bind mount: %w", path, err)
	}
	err = WithHandle(path, func(h *netlink.Handle) error {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		return h.LinkSetUp(lo)
	})
	if err != nil {
		Remove(path)
		return fmt.Errorf("set lo up in %s: %w", path, err)
	}
	return nil
}

// Remove releases the bind mount at path and removes the file. A path
// that is not there, or not mounted, is no error.
func Remove(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", path, err)
	}
	return nil
}

// WithHandle runs fn with a netlink handle in the namespace at path; no
// thread changes namespace.
func WithHandle(path string, fn func(*netlink.Handle) error) error {
	n, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer n.Close()
	h, err := netlink.NewHandleAt(n)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", path, err)
	}
	defer h.Close()
	return fn(h)
}
