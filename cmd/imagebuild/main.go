// Command imagebuild builds the agent's container image, which it
// describes (imageContent, imageConfig): the static binaries in -bin under
// /usr/local/bin on an empty base, no container engine and no network.
// `make image` builds the binaries into bin/image/ and runs it.
//
//	imagebuild -bin bin/image -tag localhost/cellium/agent:latest -o bin/cellium-agent.oci.tar
//
// The image is go-containerregistry's empty image with one layer appended:
// the binaries, laid out in an fs.FS and written by archive/tar, owned by
// root with their files' permissions (directories 0755). The result is an
// OCI image layout (go-containerregistry's layout) in a tar, an
// "oci-archive", which `podman load`, `ctr images import`, `kind load
// image-archive` and `skopeo copy oci-archive:...` accept; its index names
// the image by -tag, in the annotations they read.
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"testing/fstest"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image: the binaries (read from -bin) in binDir, and how it runs.
const binDir = "usr/local/bin"

var imageBinaries = []string{"agent", "cellium-cni"}

var imageConfig = v1.Config{
	Entrypoint: []string{"/usr/local/bin/agent"},
	Cmd:        []string{"run"},
	Labels: map[string]string{
		"org.opencontainers.image.title":       "cellium-agent",
		"org.opencontainers.image.description": "Cellium node networking agent and CNI plugin",
	},
}

func main() {
	var (
		bin = flag.String("bin", "bin/image", "The directory holding the static binaries "+fmt.Sprint(imageBinaries))
		tag = flag.String("tag", "localhost/cellium/agent:latest", "The image's name")
		out = flag.String("o", "bin/cellium-agent.oci.tar", "The OCI archive to write")
	)
	flag.Parse()
	if err := build(*bin, *tag, *out, buildTime()); err != nil {
		fmt.Fprintln(os.Stderr, "imagebuild:", err)
		os.Exit(1)
	}
	fmt.Printf("wrote %s (%s)\n", *out, *tag)
}

// buildTime is SOURCE_DATE_EPOCH when set, for a reproducible image, else
// now.
func buildTime() time.Time {
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		if sec, err := strconv.ParseInt(s, 10, 64); err == nil {
			return time.Unix(sec, 0).UTC()
		}
	}
	return time.Now().UTC().Truncate(time.Second)
}

func build(bin, tag, out string, created time.Time) error {
	files, err := imageContent(bin, created)
	if err != nil {
		return err
	}
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	if err := errors.Join(tw.AddFS(files), tw.Close()); err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar.Bytes())), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
		Created: v1.Time{Time: created}, CreatedBy: "imagebuild",
	}})
	if err != nil {
		return fmt.Errorf("append layer: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS, cfg.Created = runtime.GOARCH, "linux", v1.Time{Time: created}
	cfg.Config = imageConfig
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return fmt.Errorf("image config: %w", err)
	}
	return writeArchive(img, tag, out)
}

// imageContent is the one layer's file system: the binaries (read from
// bin) in binDir, with the directories above it. Entries are owned by root
// (fstest.MapFile has no owner), files keep their permissions, directories
// are 0755, all are dated created.
func imageContent(bin string, created time.Time) (fstest.MapFS, error) {
	files := fstest.MapFS{}
	for d := binDir; d != "."; d = path.Dir(d) {
		files[d] = &fstest.MapFile{Mode: fs.ModeDir | 0o755, ModTime: created}
	}
	for _, name := range imageBinaries {
		src := filepath.Join(bin, name)
		fi, err := os.Stat(src)
		var data []byte
		if err == nil {
			data, err = os.ReadFile(src)
		}
		if err != nil {
			return nil, fmt.Errorf("the image's %s (-bin %s): %w", name, bin, err)
		}
		files[path.Join(binDir, name)] = &fstest.MapFile{Data: data, Mode: fi.Mode().Perm(), ModTime: created}
	}
	return files, nil
}

// writeArchive writes img as an OCI layout (go-containerregistry's layout)
// into a tar at out, through a temporary file renamed over out.
func writeArchive(img v1.Image, tag, out string) error {
	dir, err := os.MkdirTemp("", "imagebuild-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("OCI layout: %w", err)
	}
	// podman and skopeo read the name from org.opencontainers.image.ref.name,
	// containerd from io.containerd.image.name.
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag,
		"io.containerd.image.name":          tag,
	}), layout.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH})); err != nil {
		return fmt.Errorf("OCI layout: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), ".imagebuild-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	tw := tar.NewWriter(tmp)
	if err := errors.Join(tw.AddFS(os.DirFS(dir)), tw.Close(), tmp.Close()); err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	return os.Rename(tmp.Name(), out)
}
