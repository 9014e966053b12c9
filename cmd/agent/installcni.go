package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
)

// cniPluginName is the plugin binary: in the image beside the agent, and
// in the runtime's CNI bin directory.
const cniPluginName = "cellium-cni"

func newInstallCNICmd(stdout io.Writer) *cobra.Command {
	var binDir, from string
	cmd := &cobra.Command{
		Use:   "install-cni",
		Short: "Copy the CNI plugin into the container runtime's CNI bin directory",
		Long: "Copy cellium-cni, which sits beside this binary in the image, into --cni-bin-dir\n" +
			"(the host's /opt/cni/bin, mounted): the DaemonSet's init container. The copy\n" +
			"replaces an older plugin in one rename, so a runtime never runs half a file.",
		Args:        cobra.NoArgs,
		Annotations: map[string]string{quietLogs: "true"},
		RunE: func(*cobra.Command, []string) error {
			if from == "" {
				self, err := os.Executable()
				if err != nil && filepath.IsAbs(os.Args[0]) {
					// No /proc (a chroot): the path it was run by.
					self, err = os.Args[0], nil
				}
				if err != nil {
					return fmt.Errorf("find this binary (--from names the plugin): %w", err)
				}
				from = filepath.Join(filepath.Dir(self), cniPluginName)
			}
			dst := filepath.Join(binDir, cniPluginName)
			if err := installFile(from, dst); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "installed %s from %s\n", dst, from)
			return nil
		},
	}
	cmd.Flags().StringVar(&binDir, "cni-bin-dir", "/host/opt/cni/bin", "The runtime's CNI bin directory, as mounted in this container")
	cmd.Flags().StringVar(&from, "from", "", "The plugin to install (default: cellium-cni beside this binary)")
	return cmd
}

// installFile copies src to dst, executable, through a temporary file in
// dst's directory renamed over dst.
func installFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("the CNI plugin to install: %w", err)
	}
	defer in.Close()
	if fi, err := os.Stat(filepath.Dir(dst)); err != nil || !fi.IsDir() {
		return fmt.Errorf("--cni-bin-dir %s: not a directory (mount the host's CNI bin directory there): %v", filepath.Dir(dst), err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+cniPluginName+"-")
	if err != nil {
		return fmt.Errorf("--cni-bin-dir: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return fmt.Errorf("copy %s to %s: %w", src, tmp.Name(), err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return fmt.Errorf("--cni-bin-dir: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("--cni-bin-dir: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("--cni-bin-dir: %w", err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return fmt.Errorf("--cni-bin-dir: %w", err)
	}
	return nil
}
