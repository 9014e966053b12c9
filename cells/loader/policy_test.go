package loader_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/lbmaps"
	"github.com/cellium/cellium/cells/loader/socklbtest"
	"github.com/cellium/cellium/cells/policy"
	"github.com/cellium/cellium/pkg/nettest"
)

// The policy tables reach the programs the loader attaches: a pod isolated
// on egress with one allow, TCP/9 to any peer, connects to port 9 (the
// host refuses it: the RST came back through the to-endpoint program as a
// reply) and not to port 10 (its SYN is dropped), nor pings.
func TestEndpointPolicy(t *testing.T) {
	env := socklbtest.New(t)
	root := bpfmapstest.Root(t)
	var (
		d           datapath
		maps        *lbmaps.Maps
		db          *statedb.DB
		entries     statedb.RWTable[*policy.Entry]
		enforcement statedb.RWTable[*policy.Enforcement]
	)
	h := env.Datapath(root, &maps, cell.Invoke(func(eps *socklbtest.Endpoints, sdb *statedb.DB,
		e statedb.RWTable[*policy.Entry], f statedb.RWTable[*policy.Enforcement]) {
		d.eps, db, entries, enforcement = eps, sdb, e, f
	}))
	d.stop = startLogging(t, h, hivetest.Logger(t))

	v4, _ := nettest.Ranges(t)
	router, podIP := v4.Addr().Next(), v4.Addr().Next().Next()
	p := newPod(t)
	p.address(t, router, podIP)
	ep := p.endpoint(1)
	ep.IPv4 = podIP
	d.put(t, ep)
	d.waitInDatapath(t, 1)

	txn := db.WriteTxn(entries, enforcement)
	entries.Insert(txn, &policy.Entry{Key: policy.EntryKey{EndpointID: 1, Direction: policy.Egress, Protocol: unix.IPPROTO_TCP, Port: 9},
		Status: reconciler.StatusPending()})
	enforcement.Insert(txn, &policy.Enforcement{EndpointID: 1, Egress: true, Status: reconciler.StatusPending()})
	txn.Commit()
	celltest.Eventually(t, "policy in the maps", func() (bool, string) {
		rtxn := db.ReadTxn()
		for e := range entries.All(rtxn) {
			if e.Status.Kind != reconciler.StatusKindDone {
				return false, fmt.Sprintf("entry %+v", e)
			}
		}
		f, _, _ := enforcement.Get(rtxn, policy.EnforcementByEndpoint.Query(1))
		return f.Status.Kind == reconciler.StatusKindDone, fmt.Sprintf("enforcement %+v", f)
	})

	dial := func(port uint16) error {
		return nettest.Do(p.netns, func() error {
			c, err := net.DialTimeout("tcp", netip.AddrPortFrom(router, port).String(), time.Second)
			if err == nil {
				c.Close()
			}
			return err
		})
	}
	if err := dial(9); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("connect to port 9: %v, want connection refused (allowed)", err)
	}
	// The dropped SYN is retransmitted until the dial gives up.
	if err := dial(10); !errors.Is(err, os.ErrDeadlineExceeded) && !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("connect to port 10: %v, want a timeout (denied)", err)
	}
	if err := nettest.Ping(p.netns, router, time.Second); err == nil {
		t.Fatal("ping answered, want it denied")
	}
}
