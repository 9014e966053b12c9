package apiv1

import (
	"encoding/json"
	"time"
)

// Paths of the routes the agent serves.
const (
	PathHealthz = "/v1/healthz"
	PathHealth  = "/v1/health"
	PathConfig  = "/v1/config"
	PathHive    = "/v1/hive"
	PathStateDB = "/v1/statedb"
	PathMaps    = "/v1/maps"
)

// Error is the body of every error response.
type Error struct {
	// Status repeats the HTTP status code.
	Status int `json:"status"`
	// Message says what was wrong, naming the input at fault.
	Message string `json:"error"`
}

// Health levels, as reported by cells through hive's cell.Health.
const (
	LevelOK       = "OK"
	LevelDegraded = "Degraded"
	LevelStopped  = "Stopped"
	LevelUnknown  = "Unknown"
)

// Healthz is the answer of the probe endpoints: /healthz and /readyz on the
// health address, and GET /v1/healthz on the API socket.
type Healthz struct {
	// Started is true once every cell's start hook has run.
	Started bool `json:"started"`
	// Ready is true once the agent has started and every readiness barrier
	// (restores, initial syncs) is done.
	Ready bool `json:"ready"`
	// Pending names the readiness barriers not yet done.
	Pending []string `json:"pending,omitempty"`
	// Waiting describes each barrier of Pending: since when the agent
	// waits for it and what for.
	Waiting []Barrier `json:"waiting,omitempty"`
}

// Barrier is a readiness barrier not yet done.
type Barrier struct {
	Name string `json:"name"`
	// Since is when the agent began to wait for it.
	Since time.Time `json:"since"`
	// WaitedSeconds is how long it has waited, when the answer was made.
	WaitedSeconds float64 `json:"waitedSeconds"`
	// Detail is what the barrier still waits for, when it says.
	Detail string `json:"detail,omitempty"`
	// Overdue is true once it has waited longer than --readiness-timeout:
	// the health module then reports it as an error.
	Overdue bool `json:"overdue,omitempty"`
}

// Health is the answer of GET /v1/health: the agent's health as a tree, one
// root node per module.
type Health struct {
	Healthz
	// Level is the worst level over all modules.
	Level   string       `json:"level"`
	Modules []HealthNode `json:"modules"`
}

// HealthNode is one module, or one scope within it (a job, a reconciler).
type HealthNode struct {
	// Name is the last element of ID.
	Name string `json:"name"`
	// ID is the dotted path from the module, e.g. "sysctl.job-reconcile".
	ID string `json:"id"`
	// Level is the node's own level combined with its children's: a node is
	// as unhealthy as its worst descendant.
	Level   string    `json:"level"`
	Message string    `json:"message,omitempty"`
	Error   string    `json:"error,omitempty"`
	Since   time.Time `json:"since,omitzero"`
	// Children are the node's sub-scopes, sorted by name.
	Children []HealthNode `json:"children,omitempty"`
}

// Config is the answer of GET /v1/config: every flag of the running agent
// and its effective value, after flags, environment and --config-dir.
type Config map[string]any

// Hive is the answer of GET /v1/hive.
type Hive struct {
	// Objects is the object listing of the running agent, as `agent hive`
	// prints it: modules, their providers, config and the start/stop hooks.
	Objects string `json:"objects"`
}

// TableInfo describes one StateDB table (GET /v1/statedb).
type TableInfo struct {
	Name                string   `json:"name"`
	Objects             int      `json:"objects"`
	Indexes             []string `json:"indexes"`
	Initialized         bool     `json:"initialized"`
	PendingInitializers []string `json:"pendingInitializers,omitempty"`
}

// Table formats of GET /v1/statedb/{table}?format=.
const (
	FormatJSON  = "json"
	FormatTable = "table"
)

// TableRows is the answer of GET /v1/statedb/{table}?format=table: the
// table's rows as the objects render themselves for humans.
type TableRows struct {
	Header []string   `json:"header"`
	Rows   [][]string `json:"rows"`
}

// TableObjects is the answer of GET /v1/statedb/{table} (format=json): the
// objects as JSON.
type TableObjects []json.RawMessage

// Map describes one BPF map the agent owns (GET /v1/maps).
type Map struct {
	Name       string `json:"name"`
	PinPath    string `json:"pinPath"`
	Type       string `json:"type"`
	KeySize    uint32 `json:"keySize"`
	ValueSize  uint32 `json:"valueSize"`
	MaxEntries uint32 `json:"maxEntries"`
	Flags      uint32 `json:"flags,omitempty"`
	// Entries is the number of entries at the time of the request, or -1
	// when the map is not open.
	Entries int `json:"entries"`
	// Origin says how the map was opened at start: "created", "reused"
	// (pinned by an earlier run) or "recreated" (pinned with another layout).
	Origin string `json:"origin,omitempty"`
	// Error is set when the map could not be opened or counted.
	Error string `json:"error,omitempty"`
}
