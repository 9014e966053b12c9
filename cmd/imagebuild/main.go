// Command imagebuild builds the agent's container image from
// deploy/Dockerfile without a container engine and without a network: for
// machines that have neither podman nor buildah. `make image` runs it.
//
//	imagebuild -f deploy/Dockerfile -context . -tag localhost/cellium/agent:latest -o bin/cellium-agent.oci.tar
//
// It understands the instructions that file uses (parseDockerfile), and
// stops at any other with an error naming the file and line. The image is
// go-containerregistry's empty image with one layer appended: the COPY
// sources, laid out in an fs.FS and written by archive/tar, owned by root
// with the sources' permissions (directories 0755), as podman's COPY makes
// them. The result is an OCI image layout (go-containerregistry's layout)
// in a tar, an "oci-archive", as `podman push oci-archive:` writes it, which
// `podman load`, `ctr images import` and `skopeo copy oci-archive:...`
// accept; its index names the image by -tag, in the annotations both read.
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
	"strings"
	"testing/fstest"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func main() {
	var (
		dockerfile = flag.String("f", "deploy/Dockerfile", "The Dockerfile")
		context    = flag.String("context", ".", "The build context: COPY sources are relative to it")
		tag        = flag.String("tag", "localhost/cellium/agent:latest", "The image's name")
		out        = flag.String("o", "bin/cellium-agent.oci.tar", "The OCI archive to write")
	)
	flag.Parse()
	if err := build(*dockerfile, *context, *tag, *out, buildTime()); err != nil {
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

func build(dockerfile, contextDir, tag, out string, created time.Time) error {
	spec, err := parseDockerfile(dockerfile)
	if err != nil {
		return err
	}
	files, err := layerFiles(dockerfile, contextDir, spec.copies, created)
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
		Created: v1.Time{Time: created}, CreatedBy: "imagebuild " + dockerfile,
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
	cfg.Config.Entrypoint, cfg.Config.Cmd, cfg.Config.Labels = spec.entrypoint, spec.cmd, spec.labels
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return fmt.Errorf("image config: %w", err)
	}
	return writeArchive(img, tag, out)
}

// layerFiles is the one layer's file system: each COPY's sources (read
// from contextDir) in its destination directory, with the directories
// above it. Entries are owned by root (fstest.MapFile has no owner), files
// keep their source's permissions, directories are 0755, all are dated
// created.
func layerFiles(dockerfile, contextDir string, copies []copyInstr, created time.Time) (fstest.MapFS, error) {
	context := os.DirFS(contextDir) // no source outside the context, as podman's COPY
	files := fstest.MapFS{}
	for _, c := range copies {
		dst := strings.TrimPrefix(path.Clean(c.dst), "/")
		for d := dst; d != "" && d != "."; d = path.Dir(d) {
			files[d] = &fstest.MapFile{Mode: fs.ModeDir | 0o755, ModTime: created}
		}
		for _, src := range c.srcs {
			var data []byte
			fi, err := fs.Stat(context, path.Clean(src))
			if errors.Is(err, fs.ErrInvalid) {
				err = errors.New("not a path inside the context")
			} else if err == nil {
				data, err = fs.ReadFile(context, path.Clean(src))
			}
			if err != nil {
				return nil, fmt.Errorf("%s:%d: COPY %s (context %s): %w", dockerfile, c.line, src, contextDir, err)
			}
			files[path.Join(dst, path.Base(src))] = &fstest.MapFile{Data: data, Mode: fi.Mode().Perm(), ModTime: created}
		}
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
