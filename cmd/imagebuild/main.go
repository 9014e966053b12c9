// Command imagebuild builds the agent's container image from
// deploy/Dockerfile without a container engine and without a network: for
// machines that have neither podman nor buildah. `make image` runs it.
//
//	imagebuild -f deploy/Dockerfile -context . -tag localhost/cellium/agent:latest -o bin/cellium-agent.oci.tar
//
// It understands the instructions that file uses, and stops at any other
// with an error naming the line: FROM scratch, COPY (files into a
// directory), LABEL, ENV, ENTRYPOINT and CMD (JSON form). The result is an
// OCI image layout in a tar (an "oci-archive"), which `podman load`,
// `ctr images import` and `skopeo copy oci-archive:...` accept; its index
// names the image by -tag, in the annotations both read.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
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
	src, err := os.ReadFile(dockerfile)
	if err != nil {
		return err
	}
	spec, err := parseDockerfile(dockerfile, src)
	if err != nil {
		return err
	}
	layerTar, err := layerOf(contextDir, spec.copies, created)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
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
	cfg.Config.Entrypoint, cfg.Config.Cmd = spec.entrypoint, spec.cmd
	cfg.Config.Env, cfg.Config.Labels = spec.env, spec.labels
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return fmt.Errorf("image config: %w", err)
	}
	return writeArchive(img, tag, out)
}

// layerOf is the one layer: the COPY sources under their destinations,
// with the directories above them, every entry owned by root and dated
// created.
func layerOf(contextDir string, copies []copyInstr, created time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	addDir := func(dir string) error {
		var parents []string
		for d := dir; d != "." && d != "/" && !dirs[d]; d = filepath.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: created, Format: tar.FormatPAX}); err != nil {
				return err
			}
		}
		return nil
	}
	for _, c := range copies {
		dst := filepath.Clean(c.dst)[1:]
		if err := addDir(dst); err != nil {
			return nil, err
		}
		for _, s := range c.srcs {
			path := filepath.Join(contextDir, s)
			data, err := os.ReadFile(path)
			if err != nil {
				return nil, fmt.Errorf("COPY %s (line %d): %w", s, c.line, err)
			}
			fi, err := os.Stat(path)
			if err != nil {
				return nil, err
			}
			hdr := &tar.Header{Typeflag: tar.TypeReg, Name: filepath.Join(dst, filepath.Base(s)),
				Mode: int64(fi.Mode().Perm()), Size: int64(len(data)), ModTime: created, Format: tar.FormatPAX}
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
			if _, err := tw.Write(data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeArchive writes img as an OCI layout into a tar at out, through a
// temporary file renamed over out.
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
	if err := tarDir(tmp, dir); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", out, err)
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), out)
}

// tarDir writes the files under dir into w, named relative to dir.
func tarDir(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		hdr.Name = rel
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}
