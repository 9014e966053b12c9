package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/etcdtest"
)

// TestReadyWhileKVStoreAway restarts the agent while etcd is away: it
// becomes ready with what it restored (a remote pod's ipcache entry
// stays), reports the kvstore Degraded, and syncs from etcd, dropping
// nothing it lists, once etcd answers again.
func TestReadyWhileKVStoreAway(t *testing.T) {
	requireRoot(t)
	etcd := etcdtest.Start(t)
	env := newAgentEnv(t)
	flags := append(env.runFlags(),
		"--kvstore", "etcd", "--kvstore-opt", "etcd.address="+etcd.Endpoint(), "--kvstore-prefix", "readytest")

	const remotePod = "10.250.0.5"
	value, err := json.Marshal(map[string]any{"ip": remotePod, "hostIP": "192.0.2.7", "identity": 256})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "readytest/state/ip/v1/"+remotePod, string(value)); err != nil {
		t.Fatal(err)
	}

	c := client.New(env.socket)
	remoteEntry := func(source string) func() (bool, string) {
		return func() (bool, string) {
			e, err := c.IPCacheLookup(context.Background(), remotePod)
			if err != nil {
				return false, err.Error()
			}
			return e.Prefix == remotePod+"/32" && e.Source == source && e.Identity == 256 && strings.HasPrefix(e.Status, "Done"),
				e.Prefix + " " + e.Source + " " + e.Status
		}
	}

	agent := startAgent(t, flags...)
	// What the agent running at a failure logged until then (waitFor
	// reads only up to the line it waits for).
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for {
			select {
			case line, ok := <-agent.logs:
				if !ok {
					return
				}
				t.Logf("agent: %v", line)
			default:
				return
			}
		}
	})
	waitAgentReady(t, "the agent with etcd up", env.socket, 60*time.Second)
	poll(t, "the remote pod in the ipcache from etcd", remoteEntry("kvstore"))
	agent.stop()

	etcd.Stop()
	agent = startAgent(t, flags...)
	waitAgentReady(t, "the agent restarted with etcd away", env.socket, 60*time.Second)
	// Not initialized, the ipcache keeps what it restored, and ready
	// says it is in the map: with etcd away the ipcache-synced barrier
	// waits no more for the kvstore's listing, but still for the entries
	// the table holds to be written (kvstore.UnlessUnreachable).
	if ok, got := remoteEntry("restored")(); !ok {
		t.Fatalf("ready with etcd away: remote pod entry %s; want the restored one, Done", got)
	}
	waitHealth(t, c, "kvstore", "etcd")
	if st, err := c.KVStore(context.Background()); err != nil || st.State == "connected" {
		t.Fatalf("kvstore status with etcd away: %+v, %v", st, err)
	}
	hz, err := c.Healthz(context.Background())
	if err != nil || !hz.Ready {
		t.Fatalf("/v1/healthz with etcd away: %+v, %v", hz, err)
	}

	etcd.Restart()
	agent.waitFor("Every ipcache source has synced")
	poll(t, "the remote pod in the ipcache from etcd again", remoteEntry("kvstore"))
	poll(t, "the kvstore connected", func() (bool, string) {
		st, err := c.KVStore(context.Background())
		return err == nil && st.State == "connected", st.State
	})
	agent.stop()
}
