package main

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// TestBuild builds the image from stand-in binaries owned by someone else
// and reads the archive back with tar and go-containerregistry: one image
// named by the tag, whose one layer holds the binaries under /usr/local/bin
// with their modes, owned by root and dated by the build time, whose config
// has the agent's entrypoint, command and labels and no environment; built
// again, the same digest. A missing binary is an error naming it, and no
// archive.
func TestBuild(t *testing.T) {
	if _, err := exec.LookPath("tar"); err != nil {
		t.Skip("needs tar to unpack the archive")
	}
	bin := t.TempDir()
	modes := map[string]os.FileMode{"agent": 0o755, "cellium-cni": 0o750}
	for name, mode := range modes {
		p := filepath.Join(bin, name)
		if err := os.WriteFile(p, []byte("stand-in "+name), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // whatever the umask
			t.Fatal(err)
		}
		if os.Geteuid() == 0 {
			if err := os.Chown(p, 1234, 5678); err != nil {
				t.Fatal(err)
			}
		}
	}
	created := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	const tag = "localhost/cellium/agent:test"
	archive := filepath.Join(t.TempDir(), "out", "agent.oci.tar")
	if err := build(bin, tag, archive, created); err != nil {
		t.Fatal(err)
	}
	img := readArchive(t, archive, tag)

	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprintf("%q %q %v %s/%t %s", cfg.Config.Entrypoint, cfg.Config.Cmd, cfg.Config.Env, cfg.OS, cfg.Architecture != "",
		cfg.Created.UTC().Format(time.RFC3339)); got != `["/usr/local/bin/agent"] ["run"] [] linux/true 2026-11-28T12:00:00Z` {
		t.Errorf("config: entrypoint, cmd, env, platform, created: %s", got)
	}
	if got := fmt.Sprint(cfg.Config.Labels); got != "map[org.opencontainers.image.description:Cellium node networking agent and CNI plugin org.opencontainers.image.title:cellium-agent]" {
		t.Errorf("labels: %s", got)
	}

	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v), want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var entries []string
	for tr := tar.NewReader(rc); ; {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, fmt.Sprintf("%s type %c mode %#o owner %d:%d%s %s %q", hdr.Name, hdr.Typeflag, hdr.Mode,
			hdr.Uid, hdr.Gid, hdr.Uname+hdr.Gname, hdr.ModTime.UTC().Format(time.RFC3339), data))
	}
	want := []string{
		`usr/ type 5 mode 0755 owner 0:0 2026-11-28T12:00:00Z ""`,
		`usr/local/ type 5 mode 0755 owner 0:0 2026-11-28T12:00:00Z ""`,
		`usr/local/bin/ type 5 mode 0755 owner 0:0 2026-11-28T12:00:00Z ""`,
		`usr/local/bin/agent type 0 mode 0755 owner 0:0 2026-11-28T12:00:00Z "stand-in agent"`,
		`usr/local/bin/cellium-cni type 0 mode 0750 owner 0:0 2026-11-28T12:00:00Z "stand-in cellium-cni"`,
	}
	if !slices.Equal(entries, want) {
		t.Errorf("layer entries:\n%s\nwant:\n%s", strings.Join(entries, "\n"), strings.Join(want, "\n"))
	}

	again := filepath.Join(t.TempDir(), "again.oci.tar")
	if err := build(bin, tag, again, created); err != nil {
		t.Fatal(err)
	}
	d1, err1 := img.Digest()
	d2, err2 := readArchive(t, again, tag).Digest()
	if d1 != d2 || err1 != nil || err2 != nil {
		t.Errorf("two builds at one time: digests %s and %s (%v, %v), want one", d1, d2, err1, err2)
	}
}

// TestBuildMissingBinary: without cellium-cni in -bin, an error naming it
// and the directory, and no archive.
func TestBuildMissingBinary(t *testing.T) {
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "agent"), []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "agent.oci.tar")
	err := build(bin, "localhost/cellium/agent:test", out, time.Now())
	if want := "the image's cellium-cni (-bin " + bin + "): "; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error %v, want %s...", err, want)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("an archive was written (%v)", err)
	}
}

// readArchive unpacks the OCI archive with tar and reads it with
// go-containerregistry's layout: its index holds one image, named image
// (podman names it by the tag alone), whose blobs match their digests.
func readArchive(t *testing.T, archive, image string) v1.Image {
	t.Helper()
	dir := t.TempDir()
	run(t, "", "tar", "-xf", archive, "-C", dir)
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("%s: %v", archive, err)
	}
	manifest, err := idx.IndexManifest()
	if err != nil {
		t.Fatalf("%s: %v", archive, err)
	}
	if len(manifest.Manifests) != 1 {
		t.Fatalf("%s: the index has %d manifests, want 1", archive, len(manifest.Manifests))
	}
	desc := manifest.Manifests[0]
	if name := desc.Annotations["org.opencontainers.image.ref.name"]; name != image && !strings.HasSuffix(image, ":"+name) {
		t.Errorf("%s: the index names the image %q, want %q", archive, name, image)
	}
	img, err := idx.Image(desc.Digest)
	if err != nil {
		t.Fatalf("%s: %v", archive, err)
	}
	if err := validate.Image(img); err != nil {
		t.Fatalf("%s: %v", archive, err)
	}
	return img
}
