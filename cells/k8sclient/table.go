package k8sclient

import (
	"strconv"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

// ManifestFile is one row of the "k8s-manifests" table: a file of the
// manifests directory as embedded mode last read it.
type ManifestFile struct {
	// Name is the file's name in --k8s-manifests-dir.
	Name string `json:"name"`
	// Objects is how many objects the file has in the embedded API server.
	// While the file is broken these are the ones of its last good content.
	Objects int `json:"objects"`
	// Digest identifies the content last read: the first 16 hex digits of
	// its SHA-256, so `sha256sum` tells whether the agent has seen an edit.
	Digest string `json:"digest"`
	// Error says why the content last read is not applied, with file:line.
	Error string `json:"error,omitempty"`
}

var _ statedb.TableWritable = &ManifestFile{}

func (f *ManifestFile) TableHeader() []string {
	return []string{"Name", "Objects", "Status", "Error", "Digest"}
}

func (f *ManifestFile) TableRow() []string {
	status := "Applied"
	if f.Error != "" {
		status = "Error"
	}
	return []string{f.Name, strconv.Itoa(f.Objects), status, f.Error, f.Digest}
}

// ManifestFileName indexes the k8s-manifests table by file name.
var ManifestFileName = statedb.Index[*ManifestFile, string]{
	Name:       "name",
	FromObject: func(f *ManifestFile) index.KeySet { return index.NewKeySet(index.String(f.Name)) },
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// ManifestsTableName is the name of the k8s-manifests table.
const ManifestsTableName = "k8s-manifests"

func newManifestFileTable(db *statedb.DB) (statedb.RWTable[*ManifestFile], error) {
	return statedb.NewTable(db, ManifestsTableName, ManifestFileName)
}
