package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/etcdtest"
)

// TestAgentKVStore runs the agent with --kvstore=etcd against a real etcd:
// it starts while etcd is down, says so in `agent status`, connects when
// etcd comes, serves keys through `agent kvstore get`, and lives through
// etcd going away again.
func TestAgentKVStore(t *testing.T) {
	requireRoot(t)
	etcd := etcdtest.Start(t)
	etcd.Stop()
	env := newAgentEnv(t)
	agent := startAgent(t, append(env.runFlags(),
		"--kvstore", "etcd", "--kvstore-opt", "etcd.address="+etcd.Endpoint(), "--kvstore-prefix", "agenttest")...)
	agent.waitFor("Started hive")

	kvState := func() apiv1.KVStore { t.Helper(); return kvstoreStatus(t, env.socket) }
	if st := kvState(); st.State == "connected" || len(st.Endpoints) != 1 {
		t.Fatalf("kvstore with etcd down: %+v", st)
	}
	out, _, code := agentCmd(t, "status", "--api-socket", env.socket)
	if code != 0 || !strings.Contains(out, "KVStore:    connecting to "+etcd.Endpoint()) {
		t.Fatalf("agent status with etcd down = %d:\n%s", code, out)
	}

	etcd.Restart()
	poll(t, "the agent connected to etcd", func() (bool, string) { st := kvState(); return st.State == "connected", st.State })

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "agenttest/state/identities/v1/id/256", "k8s:app=web"); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := agentCmd(t, "kvstore", "get", "state/identities/v1/id/256", "-o", "json", "--api-socket", env.socket)
	var keys []apiv1.KVStoreKey
	if code != 0 || json.Unmarshal([]byte(out), &keys) != nil || len(keys) != 1 || keys[0].Value != "k8s:app=web" {
		t.Fatalf("agent kvstore get = %d %s: %s", code, errOut, out)
	}
	out, _, code = agentCmd(t, "kvstore", "get", "--recursive", "state/", "--api-socket", env.socket)
	if code != 0 || !strings.Contains(out, "state/identities/v1/id/256") {
		t.Fatalf("agent kvstore get --recursive = %d:\n%s", code, out)
	}
	if _, errOut, code := agentCmd(t, "kvstore", "get", "state/none", "--api-socket", env.socket); code == 0 || !strings.Contains(errOut, "state/none") {
		t.Fatalf("agent kvstore get of a missing key = %d: %s", code, errOut)
	}

	// The metrics of the three cells.
	resp, err := http.Get("http://" + env.metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`cellium_identities{kind="reserved"} 7`, `cellium_ipcache_entries `,
		`cellium_kvstore_operation_duration_seconds_count{operation="get",result="ok"}`, `cellium_kvstore_leased_keys `} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics has no %s", want)
		}
	}

	// etcd goes away: the agent says so and keeps running.
	etcd.Stop()
	poll(t, "the agent saw etcd go", func() (bool, string) { st := kvState(); return st.State != "connected", st.State })
	select {
	case err := <-agent.exited:
		t.Fatalf("agent exited while etcd was down: %v", err)
	default:
	}
	etcd.Restart()
	poll(t, "the agent connected again", func() (bool, string) { st := kvState(); return st.State == "connected", st.State })
	agent.stop()
}

// TestAgentKVStoreRefusesWrongHost runs the agent with an etcd.config
// naming https://127.0.0.1:PORT, where an etcd serves a certificate of the
// trusted CA for other hosts (a DNS name and an IP address): the agent
// refuses the connection and writes nothing, stays up and becomes ready,
// and `agent kvstore status` and its health name the endpoint and the
// certificate check that failed. Once the server's certificate names the
// endpoint, the agent connects without a restart.
func TestAgentKVStoreRefusesWrongHost(t *testing.T) {
	requireRoot(t)
	serverDir, clientDir := t.TempDir(), t.TempDir()
	ca := etcdtest.NewCA(t, "ca")
	serverFiles := ca.IssueFor(serverDir, "server", "wrong.example", "10.9.9.9")
	clientFiles := ca.Issue(clientDir, "client")
	etcd := etcdtest.StartTLS(t, serverFiles)
	_, port, err := net.SplitHostPort(strings.TrimPrefix(etcd.Endpoint(), "https://"))
	if err != nil {
		t.Fatal(err)
	}
	endpoint := net.JoinHostPort("127.0.0.1", port)
	config := filepath.Join(t.TempDir(), "etcd.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, "endpoints: [https://%s]\ntrusted-ca-file: %s\ncert-file: %s\nkey-file: %s\n",
		endpoint, clientFiles.CA, clientFiles.Cert, clientFiles.Key), 0o600); err != nil {
		t.Fatal(err)
	}
	env := newAgentEnv(t)
	agent := startAgent(t, append(env.runFlags(),
		"--kvstore", "etcd", "--kvstore-opt", "etcd.config="+config, "--kvstore-prefix", "tlstest")...)

	kvState := func() apiv1.KVStore { t.Helper(); return kvstoreStatus(t, env.socket) }
	refused := "TLS handshake with etcd " + endpoint + ": tls: failed to verify certificate: x509: certificate is valid for 10.9.9.9, not 127.0.0.1"
	waitAgentReady(t, "the agent with a certificate for another host", env.socket, 60*time.Second)
	poll(t, "agent kvstore status names the refused certificate and the endpoint", func() (bool, string) {
		st := kvState()
		return st.State == "connecting" && strings.Contains(st.LastError, refused), st.State + ": " + st.LastError
	})
	out, _, code := agentCmd(t, "kvstore", "status", "--api-socket", env.socket)
	if code != 0 || !strings.Contains(out, refused) {
		t.Fatalf("agent kvstore status = %d, want the refused certificate named:\n%s", code, out)
	}
	waitHealth(t, client.New(env.socket), "kvstore", refused)

	// Nothing reached the server: read it with a client that does not
	// check the host.
	raw := etcdtest.UncheckedClient(t, etcd.Endpoint(), clientFiles)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if resp, err := raw.Get(ctx, "tlstest/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Fatalf("keys the agent wrote to a server it should have refused: %v, %v", resp, err)
	}
	select {
	case err := <-agent.exited:
		t.Fatalf("agent exited on a refused certificate: %v", err)
	default:
	}

	// The server's certificate now names the endpoint: the agent connects,
	// with no restart.
	etcd.Stop()
	ca.IssueFor(serverDir, "server", "127.0.0.1")
	etcd.Restart()
	poll(t, "the agent connected", func() (bool, string) { st := kvState(); return st.State == "connected", st.State + ": " + st.LastError })
	poll(t, "the agent's keys in etcd", func() (bool, string) {
		resp, err := raw.Get(ctx, "tlstest/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count > 0, fmt.Sprint(resp, err)
	})
	agent.stop()
}

// kvstoreStatus is `agent kvstore status -o json` of the agent at socket.
func kvstoreStatus(t *testing.T, socket string) apiv1.KVStore {
	t.Helper()
	out, errOut, code := agentCmd(t, "kvstore", "status", "-o", "json", "--api-socket", socket)
	if code != 0 {
		t.Fatalf("agent kvstore status = %d: %s", code, errOut)
	}
	var st apiv1.KVStore
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("agent kvstore status -o json: %v\n%s", err, out)
	}
	return st
}
