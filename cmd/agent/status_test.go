package main

import (
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cellium/cellium/pkg/apiv1"
)

// fakeAgentAPI serves answers (path to JSON status and body) on a unix
// socket until the test ends, as an agent's API would, and returns the
// socket.
func fakeAgentAPI(t *testing.T, answers map[string]func() (int, any)) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	for path, answer := range answers {
		mux.HandleFunc("GET "+path, func(w http.ResponseWriter, _ *http.Request) {
			code, body := answer()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			json.NewEncoder(w).Encode(body)
		})
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return socket
}

// `agent status` shows the identity backend, or, when the agent cannot
// say (an agent without it, or one failing to answer), why it is unknown;
// -o json is the health at the top level, as GET /v1/health answers it,
// with the backend under "identities" or the error under
// "identitiesError".
func TestStatusIdentities(t *testing.T) {
	health := apiv1.Health{Healthz: apiv1.Healthz{Started: true, Ready: true}, Level: apiv1.LevelOK,
		Modules: []apiv1.HealthNode{{Name: "daemon", ID: "daemon", Level: apiv1.LevelOK, Message: "Running"}}}
	backend := apiv1.IdentityBackend{Mode: "crd", Store: "CelliumIdentity objects", Known: 12, State: "watching"}
	for _, tc := range []struct {
		name     string
		answer   func() (int, any)
		line     string
		jsonKeys []string
	}{
		{
			name:     "known",
			answer:   func() (int, any) { return http.StatusOK, backend },
			line:     "\nIdentities: crd (CelliumIdentity objects, 12 known, watching)\n",
			jsonKeys: []string{"identities", "level", "modules", "ready", "started"},
		},
		{
			name: "unknown",
			answer: func() (int, any) {
				return http.StatusInternalServerError, apiv1.Error{Status: 500, Message: "identity backend not started"}
			},
			line:     "\nIdentities: unknown (agent answered 500 Internal Server Error: identity backend not started)\n",
			jsonKeys: []string{"identitiesError", "level", "modules", "ready", "started"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			socket := fakeAgentAPI(t, map[string]func() (int, any){
				apiv1.PathHealth:          func() (int, any) { return http.StatusOK, health },
				apiv1.PathKVStore:         func() (int, any) { return http.StatusOK, apiv1.KVStore{State: "disabled"} },
				apiv1.PathIdentityBackend: tc.answer,
			})

			out, errOut, code := agentCmd(t, "status", "--api-socket", socket)
			if code != 0 || !strings.Contains(out, tc.line) {
				t.Errorf("agent status = %d %s:\n%s\nwant the line %q", code, errOut, out, strings.TrimSpace(tc.line))
			}

			out, errOut, code = agentCmd(t, "status", "-o", "json", "--api-socket", socket)
			if code != 0 {
				t.Fatalf("agent status -o json = %d: %s", code, errOut)
			}
			var fields map[string]json.RawMessage
			if err := json.Unmarshal([]byte(out), &fields); err != nil {
				t.Fatalf("agent status -o json: %v\n%s", err, out)
			}
			var keys []string
			for k := range fields {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			if !slices.Equal(keys, tc.jsonKeys) {
				t.Errorf("agent status -o json has the keys %v, want %v:\n%s", keys, tc.jsonKeys, out)
			}
			var got struct {
				apiv1.Health
				Identities      *apiv1.IdentityBackend `json:"identities"`
				IdentitiesError string                 `json:"identitiesError"`
			}
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatal(err)
			}
			if !got.Ready || got.Level != apiv1.LevelOK || len(got.Modules) != 1 || got.Modules[0].ID != "daemon" {
				t.Errorf("agent status -o json: health %+v, want the agent's", got.Health)
			}
			switch tc.name {
			case "known":
				if got.Identities == nil || *got.Identities != backend {
					t.Errorf("agent status -o json: identities %+v, want %+v", got.Identities, backend)
				}
			case "unknown":
				if got.IdentitiesError != "agent answered 500 Internal Server Error: identity backend not started" {
					t.Errorf("agent status -o json: identitiesError %q, want the agent's answer", got.IdentitiesError)
				}
			}
		})
	}
}
