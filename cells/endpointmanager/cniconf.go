package endpointmanager

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/cilium/hive/cell"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/pkg/statefile"
)

// CNIConfFile is the name of the agent's CNI configuration in
// --cni-conf-dir. Runtimes use the first file in name order: 05 puts it
// before the usual 10-*.
const CNIConfFile = "05-cellium.conflist"

// CNIPluginType is the plugin binary's name, which runtimes look up in
// their CNI bin directory (/opt/cni/bin).
const CNIPluginType = "cellium-cni"

// writeCNIConfig writes the CNI configuration once the API serves: it takes
// the API server, so its start hook runs after the server's. A runtime that
// finds the file finds an agent to talk to; an ADD during the restore
// waits for it. The file stays when the agent stops: the plugin then
// reports the agent unreachable, and the runtime retries.
func writeCNIConfig(cfg Config, lc cell.Lifecycle, log *slog.Logger, server *api.Server) {
	if cfg.CNIConfDir == "" {
		return
	}
	lc.Append(cell.Hook{OnStart: func(cell.HookContext) error {
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
		return nil
	}})
}

// cniConfig is the network configuration list; "socket" tells the plugin
// where the agent's API is.
func cniConfig(socket string) ([]byte, error) {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "cellium",
		"plugins":    []map[string]any{{"type": CNIPluginType, "socket": socket}},
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}
