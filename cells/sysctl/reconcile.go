package sysctl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/time/rate"
)

// refreshInterval is how often every row is written again, undoing changes
// made behind the agent's back.
const refreshInterval = 10 * time.Minute

// ops writes sysctl rows into <procFS>/sys.
type ops struct {
	log    *slog.Logger
	procFS string
}

func (o *ops) Update(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, s *Sysctl) error {
	path, err := s.path(o.procFS)
	if err != nil {
		return err
	}
	current, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && s.Optional {
		o.log.Debug("Kernel has no such parameter, skipping optional sysctl", "name", s.Name)
		return nil
	}
	if err != nil {
		return fmt.Errorf("sysctl %s: %w", s.Name, err)
	}
	if string(bytes.TrimSpace(current)) == s.Value {
		return nil
	}
	if err := os.WriteFile(path, []byte(s.Value), 0); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", s.Name, s.Value, err)
	}
	o.log.Info("Set kernel parameter", "name", s.Name, "value", s.Value, "was", string(bytes.TrimSpace(current)))
	return nil
}

// Delete leaves the kernel as it is: see the package documentation.
func (o *ops) Delete(context.Context, statedb.ReadTxn, statedb.Revision, *Sysctl) error {
	return nil
}

// Prune has nothing to do: the agent does not own every kernel parameter.
func (o *ops) Prune(context.Context, statedb.ReadTxn, iter.Seq2[*Sysctl, statedb.Revision]) error {
	return nil
}

func registerReconciler(cfg Config, p reconciler.Params, tbl statedb.RWTable[*Sysctl]) error {
	if !filepath.IsAbs(cfg.ProcFS) {
		return fmt.Errorf("invalid --proc-fs %q: must be an absolute path", cfg.ProcFS)
	}
	// Checked at populate (one stat) rather than retried forever by the
	// reconciler: a wrong mount point is a configuration error.
	if fi, err := os.Stat(cfg.ProcFS); err != nil {
		return fmt.Errorf("invalid --proc-fs %q: %w; want the mount point of procfs such as /proc", cfg.ProcFS, err)
	} else if !fi.IsDir() {
		return fmt.Errorf("invalid --proc-fs %q: not a directory; want the mount point of procfs such as /proc", cfg.ProcFS)
	}
	_, err := reconciler.Register(
		p, tbl,
		(*Sysctl).clone, (*Sysctl).setStatus, (*Sysctl).getStatus,
		&ops{log: p.Log, procFS: cfg.ProcFS},
		nil,
		reconciler.WithoutPruning(),
		reconciler.WithRefreshing(refreshInterval, rate.NewLimiter(100, 10)),
	)
	return err
}
