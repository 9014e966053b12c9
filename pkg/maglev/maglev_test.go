package maglev_test

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/big"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/cellium/cellium/pkg/maglev"
)

// backends returns n distinct backend identities shaped like pod addresses.
func backends(n int) []string {
	b := make([]string, n)
	for i := range b {
		b[i] = fmt.Sprintf("10.244.%d.%d:8080", i/250, i%250+1)
	}
	return b
}

func table(t testing.TB, backends []string, m int) []int {
	t.Helper()
	tbl, err := maglev.Table(backends, m)
	if err != nil {
		t.Fatalf("Table(%d backends, %d): %v", len(backends), m, err)
	}
	if len(tbl) != m {
		t.Fatalf("Table(%d backends, %d) has %d slots", len(backends), m, len(tbl))
	}
	return tbl
}

func TestSizesArePrime(t *testing.T) {
	sizes := maglev.Sizes()
	if !slices.IsSorted(sizes) {
		t.Errorf("Sizes() = %v, want ascending", sizes)
	}
	if !slices.Contains(sizes, maglev.DefaultSize) {
		t.Errorf("DefaultSize %d is not one of Sizes() %v", maglev.DefaultSize, sizes)
	}
	for _, m := range sizes {
		if !big.NewInt(int64(m)).ProbablyPrime(20) {
			t.Errorf("size %d is not prime: some skips would not visit every slot", m)
		}
		if !maglev.IsValidSize(m) {
			t.Errorf("IsValidSize(%d) = false for a member of Sizes()", m)
		}
	}
	sizes[0] = 4
	if maglev.IsValidSize(4) {
		t.Error("changing the slice Sizes() returned changed the valid sizes")
	}
}

func TestTableRejectsBadInput(t *testing.T) {
	for _, m := range []int{-1, 0, 1, 250, 256, 16383, 65537} {
		_, err := maglev.Table(backends(3), m)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("invalid Maglev table size %d: want one of [251 509", m)) {
			t.Errorf("Table(3 backends, %d) error = %v, want one naming the size and the valid sizes", m, err)
		}
		if maglev.IsValidSize(m) {
			t.Errorf("IsValidSize(%d) = true", m)
		}
	}
	_, err := maglev.Table([]string{"10.244.0.1:80", "10.244.0.2:80", "10.244.0.1:80"}, 251)
	if err == nil || err.Error() != `duplicate Maglev backend "10.244.0.1:80": each backend needs a unique identity` {
		t.Errorf("Table with a duplicate backend: error = %v", err)
	}
}

func TestTableOfNoBackendsIsEmpty(t *testing.T) {
	tbl, err := maglev.Table(nil, maglev.DefaultSize)
	if err != nil || tbl == nil || len(tbl) != 0 {
		t.Errorf("Table(nil) = %d slots, %v; want an empty, non-nil table", len(tbl), err)
	}
}

func TestTableOfOneBackendIsAllIt(t *testing.T) {
	for _, m := range maglev.Sizes() {
		for s, b := range table(t, []string{"10.244.0.1:8080"}, m) {
			if b != 0 {
				t.Fatalf("m=%d: slot %d = %d, want backend 0", m, s, b)
			}
		}
	}
}

// TestTableBalance checks the strongest balance Maglev gives: backends take
// one slot per turn, so shares differ by at most one slot.
func TestTableBalance(t *testing.T) {
	for _, m := range maglev.Sizes() {
		for _, n := range []int{2, 3, 7, 10, 100, 300, 1000} {
			if n > m {
				continue
			}
			count := make([]int, n)
			for s, b := range table(t, backends(n), m) {
				if b < 0 || b >= n {
					t.Fatalf("m=%d n=%d: slot %d = %d, not a backend", m, n, s, b)
				}
				count[b]++
			}
			lo, hi := m/n, (m+n-1)/n
			for b, c := range count {
				if c < lo || c > hi {
					t.Errorf("m=%d n=%d: backend %d has %d slots, want %d..%d", m, n, b, c, lo, hi)
				}
			}
		}
	}
}

func TestTableWithMoreBackendsThanSlots(t *testing.T) {
	b := backends(300)
	tbl := table(t, b, 251)
	seen := map[int]bool{}
	for _, i := range tbl {
		seen[i] = true
	}
	if len(seen) != 251 {
		t.Errorf("%d backends have a slot, want 251 (one slot each)", len(seen))
	}
}

// TestTableIsOrderIndependent: the table names the same backend in every
// slot whatever the order of the input, and every call gives the same table.
func TestTableIsOrderIndependent(t *testing.T) {
	b := backends(50)
	want := identities(b, table(t, b, maglev.DefaultSize))
	rng := rand.New(rand.NewPCG(1, 2))
	for range 5 {
		shuffled := slices.Clone(b)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if got := identities(shuffled, table(t, shuffled, maglev.DefaultSize)); !slices.Equal(got, want) {
			t.Fatal("a shuffled backend list gives another table")
		}
	}
}

func identities(backends []string, tbl []int) []string {
	ids := make([]string, len(tbl))
	for s, b := range tbl {
		ids[s] = backends[b]
	}
	return ids
}

// TestTableIsStableAcrossReleases pins the table of a fixed input. Another
// node, or this agent after an upgrade, must compute the same slots, or
// established flows move. If this fails, the hash or its seeds changed.
func TestTableIsStableAcrossReleases(t *testing.T) {
	tbl := table(t, []string{"10.244.0.1:8080", "10.244.0.2:8080", "10.244.0.3:8080"}, 251)
	want := []int{0, 0, 1, 0, 0, 1, 2, 2, 0, 1, 1, 0, 0, 1, 0, 2, 0, 1, 1, 2, 2, 1, 2, 2, 0, 1, 1, 2, 2, 1, 2, 1}
	if !slices.Equal(tbl[:len(want)], want) {
		t.Errorf("first slots = %v, want %v", tbl[:len(want)], want)
	}

	sum := sha256.New()
	for _, b := range table(t, backends(100), maglev.DefaultSize) {
		sum.Write(binary.LittleEndian.AppendUint32(nil, uint32(b)))
	}
	if got, want := hex.EncodeToString(sum.Sum(nil)[:8]), "bbfc54c3fc84a530"; got != want {
		t.Errorf("SHA-256 of the default-size table of 100 backends starts %s, want %s", got, want)
	}
}

// disruptionBound is how many slots, in units of a backend's share m/n, may
// move between backends that stay when one backend leaves or joins. Maglev
// trades a little disruption for its perfect balance: a backend that leaves
// frees slots early in other permutations, which shifts later claims. At the
// default size the measured worst case is 0.1·m/n for n=10, 0.6 for n=50
// and 1.4 for n=100; modulo hashing would move nearly all m slots.
const disruptionBound = 2.0

func TestTableRemovingBackendMovesFewSlots(t *testing.T) {
	m := maglev.DefaultSize
	for _, n := range []int{10, 50, 100} {
		b := backends(n)
		before := table(t, b, m)
		worst := 0
		for removed := range n {
			rest := slices.Delete(slices.Clone(b), removed, removed+1)
			after := table(t, rest, m)
			moved := 0
			for s := range after {
				if before[s] == removed {
					continue
				}
				if b[before[s]] != rest[after[s]] {
					moved++
				}
			}
			worst = max(worst, moved)
		}
		share := float64(m) / float64(n)
		t.Logf("n=%d: removing a backend moves at most %d slots between the others (%.2f shares)", n, worst, float64(worst)/share)
		if float64(worst) > disruptionBound*share {
			t.Errorf("n=%d: removing a backend moved %d slots between the others, want at most %.0f", n, worst, disruptionBound*share)
		}
	}
}

func TestTableAddingBackendMovesFewSlots(t *testing.T) {
	m := maglev.DefaultSize
	for _, n := range []int{10, 50, 100} {
		b := backends(n)
		before := table(t, b, m)
		worst, gained := 0, 0
		for added := range 20 {
			more := append(slices.Clone(b), fmt.Sprintf("10.245.0.%d:8080", added+1))
			after := table(t, more, m)
			moved := 0
			for s := range after {
				if after[s] == n {
					gained++
					continue
				}
				if before[s] != after[s] {
					moved++
				}
			}
			worst = max(worst, moved)
		}
		share := float64(m) / float64(n+1)
		if lo := 20 * (m / (n + 1)); gained < lo {
			t.Errorf("n=%d: added backends took %d slots in 20 tries, want at least %d", n, gained, lo)
		}
		t.Logf("n=%d: adding a backend moves at most %d slots between the others (%.2f shares)", n, worst, float64(worst)/share)
		if float64(worst) > disruptionBound*share {
			t.Errorf("n=%d: adding a backend moved %d slots between the others, want at most %.0f", n, worst, disruptionBound*share)
		}
	}
}

func TestTableAllocations(t *testing.T) {
	b := backends(100)
	allocs := testing.AllocsPerRun(10, func() { maglev.Table(b, maglev.DefaultSize) })
	// The order, the permutations and the table itself: nothing per backend
	// or per slot.
	if allocs > 3 {
		t.Errorf("Table allocates %.0f times, want at most 3", allocs)
	}
}

func BenchmarkTable(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("m=%d/n=%d", maglev.DefaultSize, n), func(b *testing.B) {
			backends := backends(n)
			for b.Loop() {
				if _, err := maglev.Table(backends, maglev.DefaultSize); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tables/s")
		})
	}
}
