package clusterhealth

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// isNetns says whether path is a network namespace's bind mount.
func isNetns(path string) bool {
	var fs unix.Statfs_t
	return unix.Statfs(path, &fs) == nil && fs.Type == unix.NSFS_MAGIC
}

// ensureNetns makes path a new network namespace, unless it is one: a
// file bind-mounted over the namespace of a thread that made it, which
// outlives the agent (the health endpoint keeps its namespace across
// restarts).
func ensureNetns(path string) (created bool, err error) {
	if isNetns(path) {
		return false, nil
	}
	// A plain file (the mount went with a reboot) or nothing.
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("remove stale %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return false, fmt.Errorf("create %s: %w", path, err)
	}
	f.Close()
	err = inNewThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("new network namespace: %w", err)
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mount the namespace on %s: %w", path, err)
		}
		return nil
	})
	if err != nil {
		os.Remove(path)
		return false, err
	}
	return true, nil
}

// removeNetns unmounts and removes the namespace at path.
func removeNetns(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// listenIn opens a TCP listener on every address of the namespace at path.
func listenIn(path string, port uint16) (net.Listener, error) {
	var ln net.Listener
	err := inNetns(path, func() (err error) {
		ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		return err
	})
	return ln, err
}

// inNetns runs fn on a thread in the namespace at path; the thread goes
// back to its namespace before other goroutines may use it.
func inNetns(path string, fn func() error) error {
	target, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer target.Close()
	return inNewThread(func() error {
		if err := netns.Set(target); err != nil {
			return fmt.Errorf("enter netns %s: %w", path, err)
		}
		return fn()
	})
}

// inNewThread runs fn on a locked thread and moves the thread back to the
// namespace it had; if that fails, the thread stays locked and dies with
// its goroutine rather than run other code in the wrong namespace.
func inNewThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		err = fn()
		if serr := netns.Set(orig); serr != nil {
			errc <- errors.Join(err, fmt.Errorf("back to the agent's namespace: %w", serr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}
