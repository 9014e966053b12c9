package k8sendpoints

import (
	"time"

	"github.com/spf13/pflag"
)

// Config is the k8s-endpoints cell's configuration.
type Config struct {
	// EndpointObjectsResync is how often this node's CelliumEndpoint
	// objects are listed again and put right (stale ones deleted).
	EndpointObjectsResync time.Duration
}

var defaultConfig = Config{EndpointObjectsResync: 5 * time.Minute}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.Duration("endpoint-objects-resync", def.EndpointObjectsResync,
		"With --identity-allocation-mode=crd: how often this node's CelliumEndpoint objects are listed again, stale ones deleted and changed ones written back")
}
