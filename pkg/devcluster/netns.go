package devcluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"

	"github.com/cellium/cellium/pkg/netnsrun"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// createNetNS makes a network namespace kept alive by a bind mount at path,
// as `ip netns add` does, with lo up. It fails if path exists.
func createNetNS(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create network namespace %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("create network namespace %s: %w", path, err)
	}
	f.Close()
	errc := make(chan error)
	go func() {
		runtime.LockOSThread()
		back, err := threadNetNS()
		if err != nil {
			errc <- err
			return
		}
		defer back()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		errc <- unix.Mount(self, path, "", unix.MS_BIND, "")
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return fmt.Errorf("create network namespace %s: %w", path, err)
	}
	err = withHandle(path, func(h *netlink.Handle) error {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		return h.LinkSetUp(lo)
	})
	if err != nil {
		return fmt.Errorf("set lo up in %s: %w", path, err)
	}
	return nil
}

// deleteNetNS releases the bind mount at path and removes it. The
// namespace goes once nothing else holds it (its processes stopped). A path
// that is not there is no error.
func deleteNetNS(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount network namespace %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove network namespace %s: %w", path, err)
	}
	return nil
}

// netnsExists says whether path is a mounted network namespace.
func netnsExists(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// withHandle runs fn with a netlink handle in the namespace at path.
func withHandle(path string, fn func(*netlink.Handle) error) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", path, err)
	}
	defer h.Close()
	return fn(h)
}

// inNetNS runs fn on a thread in the network namespace at path and returns
// its result. Sockets fn makes belong to that namespace wherever they are
// used later, and processes it forks start there.
func inNetNS[T any](path string, fn func() (T, error)) (T, error) { return netnsrun.In(path, fn) }

// threadNetNS keeps the locked calling thread's network namespace and
// returns the function that moves the thread back into it and unlocks it.
// A thread left in another namespace would keep that namespace alive after
// its removal: for good if it is the main thread, which the runtime never
// ends. Should the move back fail, the thread stays locked, and the
// runtime ends it with its goroutine.
func threadNetNS() (back func(), err error) {
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open this thread's network namespace: %w", err)
	}
	return func() {
		if unix.Setns(fd, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		unix.Close(fd)
	}, nil
}

// enterNetNS moves the calling thread, which must be locked, into the
// network namespace at path.
func enterNetNS(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter network namespace %s: %w", path, err)
	}
	return nil
}

// dialIn dials addr from the network namespace at path.
func dialIn(ctx context.Context, path, network, addr string) (net.Conn, error) {
	return inNetNS(path, func() (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	})
}
