package drift

import (
	"errors"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/nettest"
)

// TestSubscriptionWithoutNetAdmin: without CAP_NET_ADMIN, where
// SO_RCVBUFFORCE fails with EPERM, ForceSocketBuffer's probe says not to
// force and a subscription is made (with SO_RCVBUF); with the option
// forced it would fail, at every retry. With the capability the probe
// says to force. The capability is dropped from this test's thread only
// (capabilities are a thread's), and given back before the thread is
// unlocked.
func TestSubscriptionWithoutNetAdmin(t *testing.T) {
	nettest.RequireRoot(t)
	runtime.LockOSThread()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var caps [2]unix.CapUserData
	if err := unix.Capget(&hdr, &caps[0]); err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("capget: %v", err)
	}
	if caps[0].Effective&(1<<unix.CAP_NET_ADMIN) == 0 {
		runtime.UnlockOSThread()
		t.Skip("the test runs without CAP_NET_ADMIN")
	}
	if force, err := probeForceSocketBuffer(); !force || err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("with CAP_NET_ADMIN the probe says force %v (%v), want true", force, err)
	}
	dropped := caps
	dropped[0].Effective &^= 1 << unix.CAP_NET_ADMIN
	if err := unix.Capset(&hdr, &dropped[0]); err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("capset: %v", err)
	}
	force, probeErr := probeForceSocketBuffer()
	yes := true
	forced, forcedErr := (&Hub{force: &yes}).Subscribe("", Kinds{Links: true}, nil, nil)
	if forcedErr == nil {
		forced.Close()
	}
	s, subErr := (&Hub{force: &force}).Subscribe("", Kinds{Links: true}, nil, nil)
	if subErr == nil {
		s.Close()
	}
	if err := unix.Capset(&hdr, &caps[0]); err != nil {
		// The thread stays locked and ends with the test's goroutine.
		t.Fatalf("capset back: %v", err)
	}
	runtime.UnlockOSThread()

	if force || !errors.Is(probeErr, unix.EPERM) {
		t.Errorf("without CAP_NET_ADMIN the probe says force %v (%v), want false with EPERM", force, probeErr)
	}
	if subErr != nil {
		t.Errorf("without CAP_NET_ADMIN the subscription failed: %v", subErr)
	}
	if !errors.Is(forcedErr, unix.EPERM) {
		t.Errorf("without CAP_NET_ADMIN a forced buffer gave %v, want EPERM (the case the probe is for)", forcedErr)
	}
}
