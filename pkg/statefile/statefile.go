// Package statefile writes the agent's state files so that a crash at any
// moment leaves either the old content or the new one, never a mix.
//
// [Write] writes to a temporary file next to the target (its name ends in
// [TempSuffix]), fsyncs it, renames it over the target and fsyncs the
// directory, so that the rename itself survives a power loss. A crash before
// the rename leaves the old file and a temporary one, which the reader
// removes with [RemoveTemps] when it restores. [WriteUnsynced] is the same
// without the syncs, for a second copy of what another file keeps durably.
// [Remove] deletes a file or a
// directory durably. [ReadRegular] reads a state file without blocking on
// what is not one (a FIFO, a directory, a device): such an entry is an
// [ErrNotRegular] error, which a loader treats like a corrupt file.
//
//	if err := statefile.Write(filepath.Join(dir, "endpoint.json"), data); err != nil { ... }
package statefile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// TempSuffix ends the name of a file that Write has not finished.
const TempSuffix = ".tmp"

// Write replaces path with data, atomically and durably. The file is
// private to the agent (mode 0600).
func Write(path string, data []byte) error { return WriteMode(path, data, 0o600) }

// WriteMode is Write for a file with the given mode, for files that others
// read.
func WriteMode(path string, data []byte, mode os.FileMode) error {
	return write(path, data, mode, true)
}

// WriteUnsynced replaces path with data atomically against a crash of the
// agent (a temporary file renamed over it) but does not wait for the disk:
// a crash of the kernel or a power loss may leave the old file, no file or
// an empty one. It is for a second copy of what another file, written with
// Write, keeps durably: the restore rebuilds it from that one.
func WriteUnsynced(path string, data []byte) error { return write(path, data, 0o600, false) }

func write(path string, data []byte, mode os.FileMode, sync bool) error {
	tmp := path + TempSuffix
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return fmt.Errorf("write state file %s: %w", path, err)
	}
	// The mode of a temporary file left by a crash is not the one asked for.
	err = f.Chmod(mode)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write state file %s: %w", path, err)
	}
	if !sync {
		return nil
	}
	return SyncDir(filepath.Dir(path))
}

// MkdirAll creates dir (and its parents) and makes the new entries durable.
func MkdirAll(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create state directory: %w", err)
	}
	return SyncDir(filepath.Dir(dir))
}

// Remove deletes path, a file or a directory with everything in it, and
// makes the removal durable. A path that does not exist is not an error.
func Remove(path string) error {
	if err := os.RemoveAll(path); err != nil {
		return fmt.Errorf("remove state %s: %w", path, err)
	}
	return SyncDir(filepath.Dir(path))
}

// Move renames from to to (on the same filesystem) durably.
func Move(from, to string) error {
	if err := os.Rename(from, to); err != nil {
		return fmt.Errorf("move state %s: %w", from, err)
	}
	if err := SyncDir(filepath.Dir(to)); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(from))
}

// SyncDir fsyncs a directory, which makes the creation, rename or removal of
// its entries durable.
// MoveAside moves path (a file or a directory) into dir, under its name and
// a time stamp so that repeated failures do not overwrite each other, and
// returns where it went. State that cannot be read is kept for whoever
// investigates, out of the way of the next restore.
func MoveAside(path, dir string) (string, error) {
	if err := MkdirAll(dir); err != nil {
		return "", err
	}
	to := filepath.Join(dir, fmt.Sprintf("%s.%d", filepath.Base(path), time.Now().UnixNano()))
	return to, Move(path, to)
}

func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync state directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync state directory %s: %w", dir, err)
	}
	return nil
}

// RemoveTemps deletes the temporary files that Write left in dir when the
// agent died in the middle of it, and returns their paths.
func RemoveTemps(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read state directory: %w", err)
	}
	var removed []string
	for _, e := range entries {
		if e.Type().IsRegular() && strings.HasSuffix(e.Name(), TempSuffix) {
			path := filepath.Join(dir, e.Name())
			if err := os.Remove(path); err != nil {
				return removed, fmt.Errorf("remove leftover temporary file: %w", err)
			}
			removed = append(removed, path)
		}
	}
	if len(removed) > 0 {
		return removed, SyncDir(dir)
	}
	return nil, nil
}

// ErrNotRegular: a state path holds something other than a regular file.
var ErrNotRegular = errors.New("not a regular file")

// MaxReadSize bounds what ReadRegular reads: state files are small, and a
// larger one is not one the agent wrote.
const MaxReadSize = 16 << 20

// ReadRegular reads the state file at path. Anything but a regular file
// (a directory, a FIFO, a socket, a device, a symbolic link) is an
// ErrNotRegular error naming what it is, found without opening it for
// reading in a way that could block: the type is checked first, and the
// open is non-blocking and does not follow links, with the type checked
// again on the open file. A missing file is an fs.ErrNotExist error.
func ReadRegular(path string) ([]byte, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, fmt.Errorf("read state file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("state file %s is a %s: %w", path, TypeName(fi.Mode()), ErrNotRegular)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("state file %s is a symbolic link: %w", path, ErrNotRegular)
	}
	if err != nil {
		return nil, fmt.Errorf("read state file: %w", &fs.PathError{Op: "open", Path: path, Err: err})
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	if fi, err = f.Stat(); err != nil {
		return nil, fmt.Errorf("read state file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("state file %s is a %s: %w", path, TypeName(fi.Mode()), ErrNotRegular)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxReadSize+1))
	if err != nil {
		return nil, fmt.Errorf("read state file: %w", err)
	}
	if len(data) > MaxReadSize {
		return nil, fmt.Errorf("state file %s is larger than %d bytes", path, MaxReadSize)
	}
	return data, nil
}

// TypeName names the type of a file mode, for errors about a path that
// holds the wrong kind of file.
func TypeName(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "regular file"
	case m.IsDir():
		return "directory"
	case m&fs.ModeSymlink != 0:
		return "symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "block device"
	}
	return "file of type " + m.Type().String()
}
