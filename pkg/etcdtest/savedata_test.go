package etcdtest

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// TestSaveDataStartsAgain: a store saved from a stopped server is what a
// server started from it holds, under its own name and ports.
func TestSaveDataStartsAgain(t *testing.T) {
	s := StartInMemoryWith(t, InMemoryOptions{})
	put(t, s, "saved-key", "saved-value")
	s.Stop()
	saved := filepath.Join(t.TempDir(), "data")
	if err := s.SaveData(saved); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveData(saved); err == nil {
		t.Error("SaveData onto an existing directory did not fail")
	}

	again := StartInMemoryWith(t, InMemoryOptions{Data: saved})
	if again.Endpoint() == s.Endpoint() || again.name == s.name {
		t.Errorf("the server started from the saved store has the first's endpoint or name (%s, %s)", again.Endpoint(), again.name)
	}
	if got := get(t, again, "saved-key"); got != "saved-value" {
		t.Fatalf("the server started from the saved store holds %q at saved-key, want %q", got, "saved-value")
	}
	// The copy is its own: the saved directory is not the one it runs on.
	put(t, again, "saved-key", "changed")
	again.Stop()
	third := StartInMemoryWith(t, InMemoryOptions{Data: saved})
	if got := get(t, third, "saved-key"); got != "saved-value" {
		t.Fatalf("a second server from the saved store holds %q at saved-key, want %q", got, "saved-value")
	}
}

func put(t *testing.T, s *Server, key, value string) {
	t.Helper()
	body := fmt.Sprintf(`{"key":%q,"value":%q}`, base64.StdEncoding.EncodeToString([]byte(key)), base64.StdEncoding.EncodeToString([]byte(value)))
	resp, err := s.call(context.Background(), http.DefaultClient, http.MethodPost, "/v3/kv/put", strings.NewReader(body))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("put %s: %v %+v", key, err, resp)
	}
}

func get(t *testing.T, s *Server, key string) string {
	t.Helper()
	body := fmt.Sprintf(`{"key":%q}`, base64.StdEncoding.EncodeToString([]byte(key)))
	resp, err := s.call(context.Background(), http.DefaultClient, http.MethodPost, "/v3/kv/range", strings.NewReader(body))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("range %s: %v %+v", key, err, resp)
	}
	var r struct {
		KVs []struct{ Value string } `json:"kvs"`
	}
	if err := json.Unmarshal(resp.Body, &r); err != nil {
		t.Fatalf("range %s: %v: %s", key, err, resp.Body)
	}
	if len(r.KVs) == 0 {
		return ""
	}
	v, err := base64.StdEncoding.DecodeString(r.KVs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return string(v)
}
