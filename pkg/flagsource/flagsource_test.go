package flagsource

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func newFlags() *pflag.FlagSet {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	fs.String("state-dir", "/default", "")
	fs.Bool("enable-ip-forwarding", true, "")
	fs.Duration("gc-interval", time.Minute, "")
	fs.StringSlice("pod-cidr", nil, "")
	return fs
}

// writeConfigMap lays out dir as a kubelet-mounted ConfigMap: the files live
// in a timestamped directory, "..data" links to it, each key links through
// "..data".
func writeConfigMap(t *testing.T, values map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	ts := filepath.Join(dir, "..2026_11_22_00_00_00.000000001")
	if err := os.Mkdir(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	for k, v := range values {
		if err := os.WriteFile(filepath.Join(ts, k), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", k), filepath.Join(dir, k)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Base(ts), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func env(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
}

func TestPrecedence(t *testing.T) {
	dir := writeConfigMap(t, map[string]string{
		"state-dir":            "/from-dir\n",
		"enable-ip-forwarding": "false",
		"gc-interval":          "5m",
		"pod-cidr":             "10.0.0.0/24,fd00::/64",
	})
	fs := newFlags()
	if err := fs.Parse([]string{"--gc-interval=7s"}); err != nil {
		t.Fatal(err)
	}
	s := Sources{EnvPrefix: "AGENT_", ConfigDir: dir, LookupEnv: env(map[string]string{
		"AGENT_STATE_DIR": "/from-env",
		"OTHER_STATE_DIR": "/ignored",
	})}
	if err := s.Apply(fs); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"state-dir":            "/from-env",               // env beats the config dir
		"gc-interval":          "7s",                      // the command line beats both
		"enable-ip-forwarding": "false",                   // the config dir beats the default
		"pod-cidr":             "[10.0.0.0/24,fd00::/64]", // parsed by the flag itself
	}
	for name, v := range want {
		if got := fs.Lookup(name).Value.String(); got != v {
			t.Errorf("--%s = %q, want %q", name, got, v)
		}
	}
}

func TestConfigDirErrors(t *testing.T) {
	tests := []struct {
		name   string
		values map[string]string
		known  []string
		want   string
	}{
		{"unknown key", map[string]string{"colour": "red"}, nil,
			`unknown key "colour" (file `},
		{"mistyped key suggests the flag", map[string]string{"state_dir": "/x"}, nil,
			`unknown key "state_dir"`},
		{"bad bool names key and form", map[string]string{"enable-ip-forwarding": "maybe"}, nil,
			`/enable-ip-forwarding): invalid argument "maybe" for "--enable-ip-forwarding" flag: strconv.ParseBool: parsing "maybe": invalid syntax (want true or false)`},
		{"bad duration", map[string]string{"gc-interval": "often"}, nil,
			`(want a duration such as 500ms, 30s or 5m)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFlags()
			err := Sources{ConfigDir: writeConfigMap(t, tc.values), Known: tc.known, LookupEnv: env(nil)}.Apply(fs)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Apply = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	t.Run("suggestion", func(t *testing.T) {
		err := Sources{ConfigDir: writeConfigMap(t, map[string]string{"state_dir": "/x"}), LookupEnv: env(nil)}.Apply(newFlags())
		if err == nil || !strings.Contains(err.Error(), `(did you mean "state-dir"?)`) {
			t.Fatalf("Apply = %v, want a suggestion", err)
		}
	})
}

func TestKnownKeysOfOtherCommandsAreAccepted(t *testing.T) {
	dir := writeConfigMap(t, map[string]string{"health-addr": ":1", "state-dir": "/s"})
	fs := newFlags()
	if err := (Sources{ConfigDir: dir, Known: []string{"health-addr"}, LookupEnv: env(nil)}).Apply(fs); err != nil {
		t.Fatalf("a key another command takes: %v", err)
	}
	if got := fs.Lookup("state-dir").Value.String(); got != "/s" {
		t.Fatalf("--state-dir = %q, want /s", got)
	}
}

func TestBadEnvValueNamesTheVariable(t *testing.T) {
	err := Sources{EnvPrefix: "AGENT_", LookupEnv: env(map[string]string{"AGENT_ENABLE_IP_FORWARDING": "yes please"})}.Apply(newFlags())
	want := `AGENT_ENABLE_IP_FORWARDING: invalid argument "yes please" for "--enable-ip-forwarding" flag`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Apply = %v, want %q", err, want)
	}
}

func TestMissingConfigDir(t *testing.T) {
	err := Sources{ConfigDir: filepath.Join(t.TempDir(), "absent"), LookupEnv: env(nil)}.Apply(newFlags())
	if err == nil || !strings.Contains(err.Error(), "--config-dir: open") {
		t.Fatalf("Apply = %v, want an error naming --config-dir", err)
	}
}

func TestDirectoryEntryIsAnError(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "state-dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := Sources{ConfigDir: dir, LookupEnv: env(nil)}.Apply(newFlags())
	if err == nil || !strings.Contains(err.Error(), "is not a regular file") {
		t.Fatalf("Apply = %v, want an error for a directory entry", err)
	}
}

func TestListValuesOnePerLine(t *testing.T) {
	dir := writeConfigMap(t, map[string]string{"pod-cidr": "10.0.0.0/24\nfd00::/64,\n\n"})
	fs := newFlags()
	fs.StringArray("label", nil, "")
	if err := (Sources{ConfigDir: dir, EnvPrefix: "AGENT_", LookupEnv: env(map[string]string{"AGENT_LABEL": "k8s:app\nk8s:io.kubernetes.pod.namespace"})}).Apply(fs); err != nil {
		t.Fatal(err)
	}
	if got, _ := fs.GetStringSlice("pod-cidr"); strings.Join(got, " ") != "10.0.0.0/24 fd00::/64" {
		t.Fatalf("--pod-cidr from two lines = %q, want both CIDRs", got)
	}
	if got, _ := fs.GetStringArray("label"); strings.Join(got, " ") != "k8s:app k8s:io.kubernetes.pod.namespace" {
		t.Fatalf("--label from two lines = %q, want one item per line", got)
	}
}

func TestSeveralLinesForOneValueIsAnError(t *testing.T) {
	dir := writeConfigMap(t, map[string]string{"state-dir": "/a\n/b\n"})
	fs := newFlags()
	err := Sources{ConfigDir: dir, LookupEnv: env(nil)}.Apply(fs)
	want := `value "/a\n/b" holds 2 lines: --state-dir takes one value`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Apply = %v, want %q", err, want)
	}
	if got := fs.Lookup("state-dir").Value.String(); got != "/default" {
		t.Fatalf("--state-dir = %q after a refused value, want the default", got)
	}
}

func TestOriginsExplainLaterErrors(t *testing.T) {
	dir := writeConfigMap(t, map[string]string{"pod-cidr": "garbage"})
	origins := Origins{}
	if err := (Sources{ConfigDir: dir, EnvPrefix: "AGENT_", Origins: origins,
		LookupEnv: env(map[string]string{"AGENT_STATE_DIR": "/from-env"})}).Apply(newFlags()); err != nil {
		t.Fatal(err)
	}
	err := origins.Explain(errors.New(`invalid --pod-cidr "garbage": want a CIDR`))
	if want := "(--pod-cidr came from --config-dir file " + filepath.Join(dir, "pod-cidr") + ")"; !strings.HasSuffix(err.Error(), want) {
		t.Fatalf("explained: %v, want it to end with %q", err, want)
	}
	err = origins.Explain(errors.New(`invalid --state-dir-extra "x"; --state-dir is fine`))
	if !strings.HasSuffix(err.Error(), "(--state-dir came from environment variable AGENT_STATE_DIR)") {
		t.Fatalf("explained: %v, want the origin of --state-dir only", err)
	}
	if err := origins.Explain(errors.New(`invalid --state-dir-extra "x"`)); strings.Contains(err.Error(), "came from") {
		t.Fatalf("explained: %v, want nothing added for a flag that only starts like one with an origin", err)
	}
}

// FuzzConfigDirValue: whatever a config-dir file holds, Apply never panics,
// and a value it accepts is used whole: a one-value flag never gets a value
// of several lines, a list flag never an item with a line break in it.
func FuzzConfigDirValue(f *testing.F) {
	for _, seed := range []string{"/var/lib/x", "10.0.0.0/24\nfd00::/64\n", "a,b\n\nc", "true", "5m", " \n ", "x\ry", "\"quoted, item\",b"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		dir := t.TempDir()
		for _, name := range []string{"state-dir", "pod-cidr", "enable-ip-forwarding", "gc-interval"} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(value), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		fs := newFlags()
		err := Sources{ConfigDir: dir, LookupEnv: env(nil)}.Apply(fs)
		if strings.ContainsAny(strings.TrimSpace(value), "\n\r") {
			if err == nil || !strings.Contains(err.Error(), "key state-dir") {
				t.Fatalf("a value of several lines for --state-dir was accepted: %v", err)
			}
		} else if got := fs.Lookup("state-dir").Value.String(); got != strings.TrimSpace(value) {
			t.Fatalf("--state-dir = %q from %q, want the whole value", got, value)
		}
		items, _ := fs.GetStringSlice("pod-cidr")
		for _, item := range items {
			if strings.ContainsAny(item, "\n\r") {
				t.Fatalf("--pod-cidr item %q has a line break (from %q)", item, value)
			}
		}
	})
}
