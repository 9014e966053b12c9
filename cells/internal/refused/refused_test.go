package refused

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cilium/hive/cell"
)

// counting counts the records logged at Warn or above.
type counting struct{ n atomic.Int32 }

func (c *counting) Enabled(context.Context, slog.Level) bool { return true }
func (c *counting) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		c.n.Add(1)
	}
	return nil
}
func (c *counting) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *counting) WithGroup(string) slog.Handler      { return c }

func newSet(t *testing.T) (*Set, *cell.SimpleHealth, *counting) {
	t.Helper()
	_, root := cell.NewSimpleHealth()
	h := root.NewScope("refused").(*cell.SimpleHealth)
	logs := &counting{}
	return New(slog.New(logs), h, "CelliumThing"), h, logs
}

// Nothing is said before the watcher has listed everything: a bad object
// of the first listing shows once it is done, with its reason; a fixed
// one leaves, and the scope says OK.
func TestReportedOnceListed(t *testing.T) {
	s, h, _ := newSet(t)
	s.Note("a", errors.New("no labels"))
	if h.Level != "" {
		t.Fatalf("before the listing: health %s %q, want nothing said", h.Level, h.Status)
	}
	s.Listed()
	if h.Level != cell.StatusDegraded || h.Status != "Ignoring 1 bad CelliumThing objects" || h.Error == nil || h.Error.Error() != "a: no labels" {
		t.Fatalf("listed with a refused: health %s %q %v", h.Level, h.Status, h.Error)
	}
	s.Note("a", nil)
	if h.Level != cell.StatusOK || h.Status != "Every CelliumThing is valid" {
		t.Fatalf("after the fix: health %s %q %v", h.Level, h.Status, h.Error)
	}
	if s.Len() != 0 || s.Err() != nil {
		t.Fatalf("after the fix: Len %d, Err %v", s.Len(), s.Err())
	}
}

// A listing with nothing refused says OK at once.
func TestListedWithNoneRefused(t *testing.T) {
	s, h, _ := newSet(t)
	s.Note("fine", nil)
	s.Listed()
	if h.Level != cell.StatusOK {
		t.Fatalf("listed, none refused: health %s %q", h.Level, h.Status)
	}
}

// Err names the first few refused objects by name, with their reasons,
// and how many more there are.
func TestErrNamesTheFirstFew(t *testing.T) {
	s, _, _ := newSet(t)
	for i := range shown + 2 {
		s.Note(fmt.Sprintf("k%02d", i), fmt.Errorf("reason %d", i))
	}
	if s.Len() != shown+2 {
		t.Fatalf("Len %d, want %d", s.Len(), shown+2)
	}
	got := s.Err().Error()
	if !strings.HasPrefix(got, "k00: reason 0; k01: reason 1;") || !strings.HasSuffix(got, fmt.Sprintf("k%02d: reason %d; and 2 more", shown-1, shown-1)) {
		t.Fatalf("Err %q", got)
	}
}

// A refusal is logged once per reason, not at every event of the object.
func TestLoggedOncePerReason(t *testing.T) {
	s, _, logs := newSet(t)
	s.Note("a", errors.New("too big"))
	s.Note("a", errors.New("too big"))
	if n := logs.n.Load(); n != 1 {
		t.Fatalf("one reason twice: %d warnings, want 1", n)
	}
	s.Note("a", errors.New("bad labels"))
	if n := logs.n.Load(); n != 2 {
		t.Fatalf("a new reason: %d warnings, want 2", n)
	}
}

// A Set without a health scope keeps and names the objects for its
// watcher (kvsync's follower) to report.
func TestWithoutHealth(t *testing.T) {
	s := New(slog.New(slog.DiscardHandler), nil, "node key")
	s.Listed()
	s.Note("state/nodes/v1/x", errors.New("names node y"))
	if s.Len() != 1 || s.Err().Error() != "state/nodes/v1/x: names node y" {
		t.Fatalf("Len %d, Err %v", s.Len(), s.Err())
	}
}
