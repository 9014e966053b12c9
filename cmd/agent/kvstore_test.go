package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/pkg/apiv1"
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

	kvState := func() apiv1.KVStore {
		t.Helper()
		out, errOut, code := agentCmd(t, "kvstore", "status", "-o", "json", "--api-socket", env.socket)
		if code != 0 {
			t.Fatalf("agent kvstore status = %d: %s", code, errOut)
		}
		var st apiv1.KVStore
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("agent kvstore status -o json: %v\n%s", err, out)
		}
		return st
	}
	if st := kvState(); st.State == "connected" || len(st.Endpoints) != 1 {
		t.Fatalf("kvstore with etcd down: %+v", st)
	}
	out, _, code := agentCmd(t, "status", "--api-socket", env.socket)
	if code != 0 || !strings.Contains(out, "KVStore: connecting to "+etcd.Endpoint()) {
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
