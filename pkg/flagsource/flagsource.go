// Package flagsource fills the flags that were not given on the command line
// from the environment and from a config directory, the way a DaemonSet
// mounts a ConfigMap: one file per flag, named after the flag, holding its
// value.
//
// Precedence, highest first: the command line, the environment
// (<prefix><FLAG>, e.g. AGENT_STATE_DIR for --state-dir), the config
// directory, the flag's default. Every value goes through the flag's own
// parser, so a bad value is rejected with the same rules wherever it comes
// from, and the error names its source, the flag and the valid form. A file in
// the config directory that names no known flag is an error too: a typo must
// not silently leave a setting at its default.
package flagsource

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/pflag"
)

// Sources says where flag values come from.
type Sources struct {
	// EnvPrefix prefixes the environment variable of each flag.
	EnvPrefix string
	// ConfigDir is the config directory; empty means none.
	ConfigDir string
	// Known lists every flag name the program has, so that a config
	// directory shared by several commands may hold keys that the running
	// command does not take. Keys outside Known and the flag set are errors.
	Known []string
	// LookupEnv reads the environment; nil means os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// Origins, when not nil, learns where Apply took each value from.
	Origins Origins
}

// Origins maps a flag name to where its value came from: the environment
// variable, or the config directory's file.
type Origins map[string]string

// Explain adds to err where the flags it names got their values: a value
// that parses but is refused later (by the cell that uses it) is then still
// traced to the variable or file that holds it.
func (o Origins) Explain(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	var from []string
	for _, name := range slices.Sorted(maps.Keys(o)) {
		if mentionsFlag(msg, name) {
			from = append(from, fmt.Sprintf("--%s came from %s", name, o[name]))
		}
	}
	if len(from) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s)", err, strings.Join(from, "; "))
}

// mentionsFlag says whether msg names --name, and not a longer flag that
// starts with it.
func mentionsFlag(msg, name string) bool {
	flag := "--" + name
	for i := strings.Index(msg, flag); i >= 0; {
		end := i + len(flag)
		if end == len(msg) || !isFlagChar(msg[end]) {
			return true
		}
		next := strings.Index(msg[end:], flag)
		if next < 0 {
			return false
		}
		i = end + next
	}
	return false
}

func isFlagChar(c byte) bool {
	return c == '-' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
}

// EnvName is the environment variable that sets flag name.
func (s Sources) EnvName(name string) string {
	return s.EnvPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// Apply sets every flag of fs that the command line left unset from the
// environment or the config directory. On error, fs may be partly set; the
// caller must not go on.
func (s Sources) Apply(fs *pflag.FlagSet) error {
	lookup := s.LookupEnv
	if lookup == nil {
		lookup = os.LookupEnv
	}
	fromDir, err := s.readConfigDir(fs)
	if err != nil {
		return err
	}
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			return
		}
		if value, ok := lookup(s.EnvName(f.Name)); ok {
			if err := set(fs, f, value); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", s.EnvName(f.Name), err))
			} else if s.Origins != nil {
				s.Origins[f.Name] = "environment variable " + s.EnvName(f.Name)
			}
			return
		}
		if value, ok := fromDir[f.Name]; ok {
			path := filepath.Join(s.ConfigDir, f.Name)
			if err := set(fs, f, value); err != nil {
				errs = append(errs, fmt.Errorf("--config-dir %s: key %s (file %s): %w", s.ConfigDir, f.Name, path, err))
			} else if s.Origins != nil {
				s.Origins[f.Name] = "--config-dir file " + path
			}
		}
	})
	return errors.Join(errs...)
}

// set sets the flag from a variable or a file's content. A list flag takes
// one item per line as well as comma-separated ones (a ConfigMap's YAML block
// scalar holds one per line); any other flag takes one line, and a value
// that cannot be used whole is an error, never a silently shortened one.
func set(fs *pflag.FlagSet, f *pflag.Flag, value string) error {
	lines := strings.FieldsFunc(value, func(r rune) bool { return r == '\n' || r == '\r' })
	if len(lines) > 1 {
		if !isList(f) {
			return fmt.Errorf("value %q holds %d lines: --%s takes one value (want %s)", value, len(lines), f.Name, WantedForm(f))
		}
		for i := range lines {
			lines[i] = strings.Trim(strings.TrimSpace(lines[i]), ",")
		}
		lines = slices.DeleteFunc(lines, func(l string) bool { return l == "" })
		if strings.HasSuffix(f.Value.Type(), "Array") {
			// An array flag takes its items one Set at a time.
			for _, l := range lines {
				if err := fs.Set(f.Name, l); err != nil {
					return invalid(f, err)
				}
			}
			return nil
		}
		value = strings.Join(lines, ",")
	}
	if err := fs.Set(f.Name, value); err != nil {
		return invalid(f, err)
	}
	return nil
}

func isList(f *pflag.Flag) bool {
	t := f.Value.Type()
	return strings.HasSuffix(t, "Slice") || strings.HasSuffix(t, "Array") || t == "stringToString"
}

// readConfigDir reads one value per file. Names starting with a dot are
// skipped: a ConfigMap volume keeps its real files in "..data" and
// timestamped directories, and links each key to them.
func (s Sources) readConfigDir(fs *pflag.FlagSet) (map[string]string, error) {
	if s.ConfigDir == "" {
		return nil, nil
	}
	entries, err := os.ReadDir(s.ConfigDir)
	if err != nil {
		return nil, fmt.Errorf("--config-dir: %w", err)
	}
	values := map[string]string{}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		path := filepath.Join(s.ConfigDir, name)
		if fs.Lookup(name) == nil && !slices.Contains(s.Known, name) {
			errs = append(errs, fmt.Errorf("--config-dir %s: unknown key %q (file %s): keys are flag names%s",
				s.ConfigDir, name, path, s.suggest(fs, name)))
			continue
		}
		fi, err := os.Stat(path) // follows the ConfigMap's links
		if err != nil {
			errs = append(errs, fmt.Errorf("--config-dir %s: key %s: %w", s.ConfigDir, name, err))
			continue
		}
		if !fi.Mode().IsRegular() {
			errs = append(errs, fmt.Errorf("--config-dir %s: key %s: %s is not a regular file", s.ConfigDir, name, path))
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, fmt.Errorf("--config-dir %s: key %s: %w", s.ConfigDir, name, err))
			continue
		}
		values[name] = strings.TrimSpace(string(b))
	}
	return values, errors.Join(errs...)
}

// suggest names the flag a mistyped key most likely meant.
func (s Sources) suggest(fs *pflag.FlagSet, key string) string {
	normal := func(k string) string { return strings.ToLower(strings.NewReplacer("_", "-", "--", "").Replace(k)) }
	candidates := slices.Clone(s.Known)
	fs.VisitAll(func(f *pflag.Flag) { candidates = append(candidates, f.Name) })
	for _, c := range candidates {
		if normal(c) == normal(key) {
			return fmt.Sprintf(" (did you mean %q?)", c)
		}
	}
	return " such as state-dir"
}

// invalid adds the form the flag wants to the error of its parser, which
// already names the value and the flag.
func invalid(f *pflag.Flag, err error) error {
	return fmt.Errorf("%w (want %s)", err, WantedForm(f))
}

// WantedForm describes the values flag f takes, for an error that refuses
// one.
func WantedForm(f *pflag.Flag) string {
	switch t := f.Value.Type(); t {
	case "bool":
		return "true or false"
	case "duration":
		return "a duration such as 500ms, 30s or 5m"
	case "int", "int8", "int16", "int32", "int64":
		return "an integer"
	case "uint", "uint8", "uint16", "uint32", "uint64":
		return "a non-negative integer"
	case "float32", "float64":
		return "a number"
	case "stringSlice", "stringArray":
		return "a comma-separated list (or one item per line in a file)"
	case "stringToString":
		return "comma-separated key=value pairs"
	default:
		return "a " + t
	}
}
