// Package version says which build of the agent this is.
package version

import (
	"runtime"
	"runtime/debug"
)

// Set at link time by `make build` and `make image`:
//
//	-ldflags "-X github.com/cellium/cellium/pkg/version.Version=v1.2.3
//	          -X github.com/cellium/cellium/pkg/version.Commit=<sha>
//	          -X github.com/cellium/cellium/pkg/version.BuildDate=2026-01-02T15:04:05Z"
//
// A plain `go build` leaves Version "dev", takes the commit from the
// build's VCS stamp when Go made one, and has no build date.
var (
	Version   = "dev"
	Commit    = ""
	BuildDate = ""
)

// Info describes the running binary.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit,omitempty"`
	Modified  bool   `json:"modified,omitempty"`
	BuildDate string `json:"buildDate,omitempty"`
	GoVersion string `json:"goVersion"`
}

// Get returns the build information of the running binary.
func Get() Info {
	info := Info{Version: Version, Commit: Commit, BuildDate: BuildDate, GoVersion: runtime.Version()}
	if info.Commit != "" {
		return info
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Commit = s.Value
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
	}
	return info
}
