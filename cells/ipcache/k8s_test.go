package ipcache

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/k8sendpoints"
)

// Other nodes' pods from their CelliumEndpoint objects claim their
// addresses (source k8s) behind their node; of two objects with one
// address, the newer.
func TestK8sClaims(t *testing.T) {
	db := statedb.New()
	tbl, err := statedb.NewTable(db, k8sendpoints.TableName, k8sendpoints.ByName, k8sendpoints.ByAddress)
	if err != nil {
		t.Fatal(err)
	}
	ip, nodeIP, now := netip.MustParseAddr("10.2.0.5"), netip.MustParseAddr("192.0.2.2"), time.Now()
	txn := db.WriteTxn(tbl)
	tbl.Insert(txn, &k8sendpoints.Endpoint{Namespace: "default", Name: "old", Node: "node-2", NodeIP: nodeIP, Identity: 300,
		Addresses: []netip.Addr{ip}, Created: now.Add(-time.Hour)})
	tbl.Insert(txn, &k8sendpoints.Endpoint{Namespace: "default", Name: "new", Node: "node-2", NodeIP: nodeIP, Identity: 301,
		Addresses: []netip.Addr{ip, netip.MustParseAddr("fd00::5")}, Created: now})
	txn.Commit()
	claims, _, init := k8sClaims(db.ReadTxn(), tbl)
	if !init {
		t.Fatal("a table with no initializers not initialized")
	}
	want := map[netip.Prefix]Claim{
		netip.MustParsePrefix("10.2.0.5/32"): {Source: SourceK8s, Identity: 301, HostIP: nodeIP, Namespace: "default", PodName: "new"},
		netip.MustParsePrefix("fd00::5/128"): {Source: SourceK8s, Identity: 301, HostIP: nodeIP, Namespace: "default", PodName: "new"},
	}
	if len(claims) != len(want) {
		t.Fatalf("claims %v, want %v", claims, want)
	}
	for p, c := range want {
		if claims[p] != c {
			t.Errorf("claim of %s = %+v, want %+v", p, claims[p], c)
		}
	}
}
