# Cellium. `make run` builds and runs the agent (as root); `make test` runs
# every test (as root for the ones that need the kernel).

GO      ?= go
BIN     ?= bin
ARGS    ?=
# Go sources that gofmt checks (the generated BPF bindings are gofmt'd too).
GODIRS  := cmd cells pkg bpf

# What `agent version` says: the nearest tag (or the commit), the commit and
# when it was built (SOURCE_DATE_EPOCH when set, for reproducible builds).
VERSION    ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT     ?= $(shell git rev-parse HEAD 2>/dev/null)
BUILD_DATE ?= $(shell date -u $(if $(SOURCE_DATE_EPOCH),-d @$(SOURCE_DATE_EPOCH)) +%Y-%m-%dT%H:%M:%SZ)
LDFLAGS    := -X github.com/cellium/cellium/pkg/version.Version=$(VERSION) \
              -X github.com/cellium/cellium/pkg/version.Commit=$(COMMIT) \
              -X github.com/cellium/cellium/pkg/version.BuildDate=$(BUILD_DATE)

# The image: its name (deploy/ uses it) and the OCI archive written under
# $(BIN).
IMAGE         ?= localhost/cellium/agent:latest
IMAGE_ARCHIVE ?= $(BIN)/cellium-agent.oci.tar

.PHONY: fuzz build run dev-cluster dev-cluster-down test test-k8s kube-apiserver etcd hubble-relay lint bpf check-bpf image bench bench-lb bench-hubble bench-ctgc bench-identity bench-ipcache bench-crd bench-nodes bench-crossnode bench-policy-window bench-policy bench-policy-datapath bench-policy-converge bench-probe bench-masq bench-nodeport bench-agent bench-cni docs clean

# The agent and the CNI plugin (what the image ships), and cellium-dev, the
# developer's tooling (`cellium-dev cluster`), which the agent does not link
# and which runs the agent and plugin beside it. The plugin is static, as
# the image has it: every pod's ADD execs it, and a cgo build pays the
# dynamic loader and libc's start each time.
build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/agent ./cmd/agent
	CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/cellium-cni ./cmd/cellium-cni
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/cellium-dev ./cmd/cellium-dev

# The container image, described and built by cmd/imagebuild (no container
# engine, no network): static, stripped binaries in bin/image/, then the
# image, into $(IMAGE_ARCHIVE), which `podman load`, `ctr images import`
# and `kind load image-archive` take.
image:
	@mkdir -p bin/image $(dir $(IMAGE_ARCHIVE))
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w $(LDFLAGS)" -o bin/image/agent ./cmd/agent
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w $(LDFLAGS)" -o bin/image/cellium-cni ./cmd/cellium-cni
	$(GO) run ./cmd/imagebuild -bin bin/image -tag $(IMAGE) -o $(IMAGE_ARCHIVE)

# Runs with embedded defaults: no cluster, no etcd. Extra flags: make run ARGS="--log-level=debug".
run: build
	./$(BIN)/agent run $(ARGS)

# A cluster of agents on this machine (as root, needs Debian's etcd-server):
# make dev-cluster ARGS="--nodes 3"; make dev-cluster-down. docs/dev-cluster.md.
dev-cluster: build
	./$(BIN)/cellium-dev cluster up $(ARGS)

dev-cluster-down: build
	./$(BIN)/cellium-dev cluster down $(ARGS)

# kube-apiserver and hubble-relay are built first (once per machine, into
# the user's cache dir): cmd/agent's TestKubeAPIServer runs the agent
# against the one, pkg/devcluster's TestHubbleRelay the other. The
# end-to-end tests of pkg/devcluster (two-node clusters, the policy truth
# table) take 5-7 minutes under -race on a loaded 2-core machine, close to
# go test's default 10-minute limit per package: the limit is 30 minutes.
test: lint kube-apiserver hubble-relay
	$(GO) test -race -count=1 -timeout 30m ./...

# The integration test against a real kube-apiserver and etcd alone.
test-k8s: kube-apiserver
	$(GO) test -count=1 -run '^TestKubeAPIServer$$' -v ./cmd/agent

# kube-apiserver from k8s.io/kubernetes through the module proxy, built in a
# module of its own under $$XDG_CACHE_HOME/cellium (~/.cache/cellium):
# minutes the first time on a machine, nothing afterwards.
kube-apiserver:
	GO=$(GO) $(GO) run ./pkg/kubeapiserver/build_kube_apiserver.go

# etcd 3.6 (etcdtest.StreamingVersion) from its server module through the
# module proxy, built the same way under $$XDG_CACHE_HOME/cellium: the etcd
# of `make bench-agent`'s API server. Tests use Debian's etcd-server.
etcd:
	GO=$(GO) $(GO) run ./pkg/etcdtest/build_etcd.go

# Every Go fuzz target (func FuzzXxx in a _test.go file) for FUZZTIME each.
# `make test` already runs their seed corpora; this explores beyond them. A
# crash leaves its input under the package's testdata/fuzz/FuzzXxx/: commit
# it, and it is a seed from then on.
# The default is a count of executions, not a duration: with a duration,
# Go 1.26's fuzzing coordinator can fail a target that found nothing with
# "context deadline exceeded" when the deadline races a busy worker
# (Go issue 75804, fixed in Go 1.27). A count has no deadline to race.
FUZZTIME ?= 5000x
fuzz:
	@mkdir -p $(BIN); set -e; grep -rl --include='*_test.go' '^func Fuzz' $(GODIRS) | sort | while read -r file; do \
		dir=$$(dirname "$$file"); \
		for name in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$$file"); do \
			echo "fuzz $$name ./$$dir ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) "./$$dir" > $(BIN)/fuzz-$$name.out 2>&1 || { cat $(BIN)/fuzz-$$name.out; exit 1; }; \
		done; \
	done

# hubble-relay and the hubble CLI from github.com/cilium/cilium through
# the module proxy, built in a module of their own under
# $$XDG_CACHE_HOME/cellium (~/.cache/cellium): minutes the first time on a
# machine, nothing afterwards.
hubble-relay:
	GO=$(GO) $(GO) run ./pkg/hubblerelay/build_hubble_relay.go

lint:
	@unformatted="$$(gofmt -l $(GODIRS))"; \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

# Regenerates the BPF objects and their Go bindings (needs clang-19, llvm-19, libbpf-dev).
bpf:
	$(GO) generate ./bpf/...

# Fails when the committed BPF objects are not what the sources compile to.
check-bpf: bpf
	@git diff --exit-code --stat -- bpf/ || \
	{ echo "bpf/: committed objects are stale: run 'make bpf' and commit the result"; exit 1; }

# Every benchmark (as root; see docs/performance.md), then one summary line
# per benchmark, `name key=value ...`.
BENCHES := bench-lb bench-agent bench-cni bench-hubble bench-ctgc bench-identity bench-ipcache bench-crd bench-nodes bench-crossnode bench-policy-window bench-policy bench-policy-datapath bench-policy-converge bench-probe bench-masq bench-nodeport
bench: $(BENCHES)
	@echo "--- make bench"
	@for b in $(BENCHES); do grep -h -E '^[a-z0-9-]+-bench ' $(BIN)/$$b.out; done

# Load-balancing pipeline benchmark (as root): Services from Kubernetes
# events into real BPF maps, at 1k, 10k and 50k services, five runs each
# (rates from the mean durations). Ends with the summary line
# `lb-bench services=... insert_per_s=...`.
bench-lb:
	@mkdir -p $(BIN)
	$(GO) test ./cells/lbmaps -run '^$$' -bench Pipeline -benchtime 1x -count 1 | tee $(BIN)/bench-lb.out
	@grep '^lb-bench' $(BIN)/bench-lb.out | tail -n 1

# The whole agent (as root), built and run as a process with private paths,
# in a memory cgroup of its own: its memory after 60 s idle with default
# flags in embedded mode (`agent-idle-bench ...`: VmRSS, RssAnon, RssFile,
# the cgroup's working set), and a first start, restart and stop against a
# real kube-apiserver (kubeconfig mode) holding 50,000 Services and their
# EndpointSlices, with the API server's CPU and bytes sent per start and
# for 20 agents' list-and-watch at once (`agent-scale-bench mode=cluster
# ...`). Its etcd is the one `make etcd` builds (as production clusters',
# it lets kube-apiserver stream lists and serve consistent reads from its
# cache; ETCD_BIN chooses another). Creating the objects through the API
# server comes first: kube-apiserver's cluster IP allocation makes it
# quadratic, about 30 minutes at 20,000 and hours at 50,000 on 2 shared
# cores (BENCH_SERVICES to change the size; docs/performance.md). etcd's
# store is then saved in BENCH_CLUSTER_CACHE, and
# a later run with the same size and binaries starts from it
# (`setup=cached setup_s=0`). BenchmarkScale, the same on a manifests
# directory in embedded mode, is not part of it.
BENCH_SERVICES ?= 50000
BENCH_CLUSTER_CACHE ?= $(HOME)/.cache/cellium/agent-scale-bench
bench-agent: kube-apiserver etcd
	@mkdir -p $(BIN)
	$(GO) test ./cmd/agent -run '^$$' -bench 'IdleAgent|ScaleCluster' -bench.services $(BENCH_SERVICES) -bench.cluster-cache $(BENCH_CLUSTER_CACHE) -benchtime 1x -count 1 -timeout 300m | tee $(BIN)/bench-agent.out
	@grep -E '^agent-(idle|scale)-bench' $(BIN)/bench-agent.out

# CNI ADD (as root): 100 pods added at once through the built plugin and
# agent, beside the floor (a plugin that does nothing, as many execs at
# once), the kernel floor (the ADDs' veth pairs, addresses and routes
# made at once without the agent) and single ADDs on the idle node;
# latency percentiles and the
# agent's CPU and memory per 1,000 pods. Ends with `cni-bench ...`,
# `cni-live-bench ...` (the parts of the ADDs' wait for the datapath) and
# `cni-steps-bench ...` (how long each step of a creation took in the agent)
# and `cni-breakdown-bench ...` (in the agent and outside it; netlink
# requests and syncs per ADD, counted under strace).
bench-cni:
	@mkdir -p $(BIN)
	$(GO) test ./cmd/cellium-cni -run '^$$' -bench AddParallel -benchtime 1x -count 1 | tee $(BIN)/bench-cni.out
	@grep -E '^cni-(live-|steps-|breakdown-)?bench ' $(BIN)/bench-cni.out | tail -n 4

# Hubble pipeline benchmark (as root): datapath event records written into
# the real ring buffer, decoded by the monitor, converted to flows into the
# Hubble ring. Ends with the summary line `hubble-bench flows_per_s=...`.
bench-hubble:
	@mkdir -p $(BIN)
	$(GO) test ./cells/hubble -run '^$$' -bench HubblePipeline -benchtime 1x -count 1 | tee $(BIN)/bench-hubble.out
	@grep '^hubble-bench' $(BIN)/bench-hubble.out | tail -n 1

# Conntrack GC benchmark (as root): a real conntrack map of a million
# entries, half expired; one GC pass against a raw batch dump of the same
# map. Ends with the summary line `ctgc-bench entries=... gc_entries_per_s=...`.
bench-ctgc:
	@mkdir -p $(BIN)
	$(GO) test ./cells/ctgc -run '^$$' -bench '^BenchmarkGCPass$$' -benchtime 1x -count 1 | tee $(BIN)/bench-ctgc.out
	@grep '^ctgc-bench' $(BIN)/bench-ctgc.out | tail -n 1

# Policy computation (cells/policy): 1,000 policies over 10,000 identities
# and 100 local endpoints; one new identity applied (time, CPU time,
# entries written), and the Go heap per policy entry and per selector.
# Ends with `policy-bench new_identity_us=...` and `policy-bench
# bytes_per_entry=... bytes_per_selector=...`; then (as root) the kernel
# memory per entry of the policy trie (cells/policymaps, 65,500 entries):
# `policy-map-bench memlock_bytes_per_entry=... kernel_bytes_per_entry=...`.
bench-policy:
	@mkdir -p $(BIN)
	$(GO) test ./cells/policy -run '^$$' -bench 'FromScratch$$|Memory' -benchtime 1x -count 1 | tee $(BIN)/bench-policy.out
	$(GO) test ./cells/policy -run '^$$' -bench 'NewIdentity' -benchtime 200x -count 1 | tee -a $(BIN)/bench-policy.out
	$(GO) test ./cells/policymaps -run '^$$' -bench 'MapMemory' -benchtime 1x -count 1 | tee -a $(BIN)/bench-policy.out
	$(GO) test ./cells/policymaps -run '^$$' -bench 'Prune' -benchtime 10x -count 1 | tee -a $(BIN)/bench-policy.out
	@grep -E '^policy-(map-)?(prune-)?bench' $(BIN)/bench-policy.out

# Identity allocation against a real etcd (as root, needs Debian's
# etcd-server): 2,000 new label sets from 32 goroutines, then the same
# again. Ends with `identity-bench ... new_per_s=... known_per_s=...`.
bench-identity:
	@mkdir -p $(BIN)
	$(GO) test ./cells/identity -run '^$$' -bench Allocate -benchtime 1x -count 1 | tee $(BIN)/bench-identity.out
	@grep '^identity-bench' $(BIN)/bench-identity.out | tail -n 1

# ipcache (as root, with etcd-server): 100,000 ip/v1 keys written to etcd
# by another client into the BPF map; then an agent's start against 10,000
# identities and 100,000 ip/v1 keys until the kvstore is listed. Ends with
# `ipcache-bench ...` and `kvstore-start-bench ...`.
bench-ipcache:
	@mkdir -p $(BIN)
	$(GO) test ./cells/ipcache -run '^$$' -bench 'KVStoreToMap|StartListed' -benchtime 1x -count 1 | tee $(BIN)/bench-ipcache.out
	@grep -E '^(ipcache-bench|kvstore-start-bench)' $(BIN)/bench-ipcache.out

# Identities and endpoints through the Kubernetes API (as root, with
# etcd-server and the project's kube-apiserver): a pod's endpoint on node-1
# until node-2's ipcache map has its identity, crd and kvstore mode side by
# side, p50/p99 of 100 pods, and crd mode's API requests per pod start
# (`remote-identity-bench mode=...`); an agent's memory per 1,000 remote
# endpoints (`crd-memory-bench ...`); an agent's start against 1,000
# CelliumIdentity and 10,000 CelliumEndpoint objects until every address is
# in its ipcache map (`crd-start-bench ...`).
bench-crd: kube-apiserver
	@mkdir -p $(BIN)
	$(GO) test ./cells/ipcache -run '^$$' -bench 'RemotePodIdentity|CRDStart' -benchtime 1x -count 1 -timeout 30m | tee $(BIN)/bench-crd.out
	@grep -E '^(remote-identity-bench|crd-memory-bench|crd-start-bench)' $(BIN)/bench-crd.out

# Nodes (as root, with etcd-server): 1,000 nodes appearing in the kvstore
# until their routes, neighbors, fdb entries and ipcache entries are in the
# kernel. Ends with `nodes-bench ...`.
bench-nodes:
	@mkdir -p $(BIN)
	$(GO) test ./cells/routing -run '^$$' -bench NodesAppear -benchtime 1x -count 1 | tee $(BIN)/bench-nodes.out
	@grep '^nodes-bench' $(BIN)/bench-nodes.out | tail -n 1

# Cross-node TCP throughput on a dev-cluster (as root, with etcd-server):
# pod to pod in each routing mode beside node to node over the same path.
# Ends with one `crossnode-bench mode=...` line per mode.
bench-crossnode:
	@mkdir -p $(BIN)
	$(GO) test ./pkg/devcluster -run '^$$' -bench CrossNodeThroughput -benchtime 1x -count 1 | tee $(BIN)/bench-crossnode.out
	@grep '^crossnode-bench' $(BIN)/bench-crossnode.out

# The cross-node policy window on a dev-cluster (as root, with etcd-server):
# a new pod on node-1 until node-2 enforces its ingress policy with the
# pod's identity, p50/p99 of 20 pods with a new identity and 20 with a
# known one: `policy-window-bench variant=...` (docs/policy.md).
bench-policy-window:
	@mkdir -p $(BIN)
	$(GO) test ./pkg/devcluster -run '^$$' -bench CrossNodePolicyWindow -benchtime 1x -count 1 | tee $(BIN)/bench-policy-window.out
	@grep '^policy-window-bench' $(BIN)/bench-policy-window.out

# Policy in the datapath on a one-node dev-cluster (as root, with
# etcd-server): pod-to-pod round trips, new connections and TCP throughput
# with an allow policy isolating both pods against no policy, alternating
# in one run: `policy-datapath-bench rr_ratio=... crr_ratio=...
# gbps_ratio=...` (policy over none; docs/performance.md).
bench-policy-datapath:
	@mkdir -p $(BIN)
	$(GO) test ./pkg/devcluster -run '^$$' -bench PolicyDatapath -benchtime 1x -count 1 | tee $(BIN)/bench-policy-datapath.out
	@grep '^policy-datapath-bench' $(BIN)/bench-policy-datapath.out

# Policy convergence on a one-node dev-cluster of 100 pods (as root, with
# etcd-server): a NetworkPolicy selecting all of them written (and
# removed) until the last pod's key is in (out of) the policy trie:
# `policy-converge-bench add_p50_ms=... delete_p50_ms=...`.
bench-policy-converge:
	@mkdir -p $(BIN)
	$(GO) test ./pkg/devcluster -run '^$$' -bench PolicyConvergence -benchtime 1x -count 1 -timeout 30m | tee $(BIN)/bench-policy-converge.out
	@grep '^policy-converge-bench' $(BIN)/bench-policy-converge.out

# NodePort (as root, with etcd-server): request/response round trips and a
# bulk TCP stream (Gbit/s, machine CPU seconds per Gbit) from outside
# through node-1's NodePort to a backend on node-2, beside node-1 straight
# to the backend pod: `nodeport-bench ...` (--lb-mode=snat) and
# `nodeport-bench mode=dsr ...`.
bench-nodeport:
	@mkdir -p $(BIN)
	$(GO) test ./pkg/devcluster -run '^$$' -bench NodePort -benchtime 1x -count 1 | tee $(BIN)/bench-nodeport.out
	@grep '^nodeport-bench' $(BIN)/bench-nodeport.out

# Pod egress masquerade (as root): new TCP connections per second from a
# pod namespace to an "outside" namespace through the agent's nftables
# rules, beside the destination excluded and no table at all. Ends with
# `masq-bench conns_per_s=...`.
bench-masq:
	@mkdir -p $(BIN)
	$(GO) test ./cells/masquerade -run '^$$' -bench MasqueradeConnections -benchtime 1x -count 1 | tee $(BIN)/bench-masq.out
	@grep '^masq-bench' $(BIN)/bench-masq.out

# Node health probes (as root): one round of 100 and of 1,000 simulated
# peers, CPU and memory of the prober. Ends with `probe-bench ...` lines.
bench-probe:
	@mkdir -p $(BIN)
	$(GO) test ./cells/clusterhealth -run '^$$' -bench ProbeCost -benchtime 1x -count 1 | tee $(BIN)/bench-probe.out
	@grep '^probe-bench' $(BIN)/bench-probe.out

# Renders the cell graph for docs/architecture.md (needs graphviz).
docs: build
	./$(BIN)/agent hive dot-graph | dot -Tsvg -o docs/cell-graph.svg

clean:
	rm -rf $(BIN)
