package endpointmanager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/pkg/statefile"
)

// CNIConfFile is the name of the agent's CNI configuration in
// --cni-conf-dir. Runtimes use the first file in name order: 05 puts it
// before the usual 10-*.
const CNIConfFile = "05-cellium.conflist"

// CNIVersion is the configuration's "cniVersion": 1.0.0, which every
// runtime's CNI library takes. CNIVersions are its "cniVersions" (CNI 1.1's
// negotiation): a library that knows them (libcni v1.2 and later) uses the
// newest it implements, 1.1.0 with the STATUS and GC verbs; an older one
// (libcni v1.1.x, as containerd 1.7 links it) reads "cniVersion" only, and
// could not parse a 1.1.0 result, so every ADD would fail there. The
// plugin answers in the version it is given.
const CNIVersion = "1.0.0"

// CNIVersions are the versions the plugin speaks (see CNIVersion).
var CNIVersions = []string{"1.0.0", "1.1.0"}

// CNIPluginType is the plugin binary's name, which runtimes look up in
// their CNI bin directory (/opt/cni/bin).
const CNIPluginType = "cellium-cni"

// writeCNIConfig writes the CNI configuration once the agent is ready:
// every readiness barrier done, so the endpoints are restored and the
// Services, the ipcache and the devices are in place. Until then the
// kubelet sees no network on the node and sends it no pods. The file stays
// when the agent stops: the plugin's STATUS then reports the agent
// unreachable, an ADD is retried, and pods already running keep their
// network. `agent cleanup` removes it.
func writeCNIConfig(cfg Config, jobs job.Group, log *slog.Logger, server *api.Server, readiness *health.Readiness) {
	if cfg.CNIConfDir == "" {
		return
	}
	jobs.Add(job.OneShot("write-cni-config", func(ctx context.Context, h cell.Health) error {
		for {
			hz, watch := readiness.Status()
			if hz.Ready {
				break
			}
			h.OK("Waiting for the agent to be ready: " + strings.Join(hz.Pending, ", "))
			select {
			case <-watch:
			case <-ctx.Done():
				return nil
			}
		}
		data, err := cniConfig(server.SocketPath())
		if err != nil {
			return err
		}
		if err := statefile.MkdirAll(cfg.CNIConfDir); err != nil {
			return fmt.Errorf("--cni-conf-dir: %w", err)
		}
		path := filepath.Join(cfg.CNIConfDir, CNIConfFile)
		if err := statefile.WriteMode(path, data, 0o644); err != nil {
			return fmt.Errorf("--cni-conf-dir: %w", err)
		}
		log.Info("Wrote CNI configuration", "file", path, "socket", server.SocketPath())
		h.OK("Wrote " + path)
		return nil
	}, job.WithRetry(-1, &job.ExponentialBackoff{Min: time.Second, Max: time.Minute})))
}

// RemoveCNIConfig removes the CNI configuration from --cni-conf-dir, for
// `agent cleanup`. It returns what it removed: nothing when there was no
// file.
func RemoveCNIConfig(cfg Config) (removed []string, err error) {
	if cfg.CNIConfDir == "" {
		return nil, nil
	}
	path := filepath.Join(cfg.CNIConfDir, CNIConfFile)
	switch err := os.Remove(path); {
	case err == nil:
		return []string{"removed CNI configuration " + path}, nil
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil
	default:
		return nil, fmt.Errorf("remove the CNI configuration: %w", err)
	}
}

// cniConfig is the network configuration list; "socket" tells the plugin
// where the agent's API is.
func cniConfig(socket string) ([]byte, error) {
	conf := map[string]any{
		"cniVersion":  CNIVersion,
		"cniVersions": CNIVersions,
		"name":        "cellium",
		"plugins":     []map[string]any{{"type": CNIPluginType, "socket": socket}},
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}
