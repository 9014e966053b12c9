package etcdtest

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/cellium/cellium/pkg/toolbuild"
)

// StreamingVersion is the etcd that BuildStreaming builds: one with the
// progress notifications (3.5.13 and later) that kube-apiserver's watch
// cache needs to serve streaming lists (sendInitialEvents) and consistent
// reads, as production clusters' etcd has. Debian's etcd 3.4.23, which the
// tests use, has them not.
const StreamingVersion = "v3.6.8"

// StreamingCacheDir is where BuildStreaming builds: $XDG_CACHE_HOME (or
// ~/.cache, or without a home the temporary directory)
// /cellium/etcd-<version>, once per machine, outside the repository.
func StreamingCacheDir() string { return toolbuild.CacheDir("etcd-" + StreamingVersion) }

// StreamingBinary is the etcd BuildStreaming built, or an error saying
// how to build it.
func StreamingBinary() (string, error) {
	bin := filepath.Join(StreamingCacheDir(), "etcd")
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("no etcd %s at %s: build it with `make etcd`", StreamingVersion, bin)
	}
	return bin, nil
}

// BuildStreaming builds etcd StreamingVersion from its server module
// (go.etcd.io/etcd/server/v3's etcdmain) through the module proxy, in a
// module of its own in StreamingCacheDir, unless it is there already, and
// returns its path. The go command's output goes to log. Concurrent builds
// on one machine wait for each other.
func BuildStreaming(ctx context.Context, gocmd string, log io.Writer) (string, error) {
	d, err := toolbuild.Lock(ctx, StreamingCacheDir(), gocmd, log)
	if err != nil {
		return "", err
	}
	defer d.Close()
	if d.Has("etcd") {
		return filepath.Join(d.Path, "etcd"), nil
	}
	fmt.Fprintf(log, "building etcd %s in %s (once per machine; a few minutes)\n", StreamingVersion, d.Path)
	files := map[string]string{
		"go.mod": "module etcdbuild\n\ngo 1.26\n\nrequire go.etcd.io/etcd/server/v3 " + StreamingVersion + "\n",
		// etcd's own main (go.etcd.io/etcd/v3) is a module of the
		// repository's root that also links etcdctl and etcdutl; the
		// server is etcdmain.Main.
		"main.go": "package main\n\nimport (\n\t\"os\"\n\n\t\"go.etcd.io/etcd/server/v3/etcdmain\"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n",
	}
	for name, text := range files {
		if err := d.WriteFile(name, text); err != nil {
			return "", err
		}
	}
	if _, err := d.Go("mod", "tidy"); err != nil {
		return "", err
	}
	return d.Build("etcd", ".")
}
