# Cellium. `make run` builds and runs the agent (as root); `make test` runs
# every test (as root for the ones that need the kernel).

GO      ?= go
BIN     := bin
ARGS    ?=
# Go sources that gofmt checks (the generated BPF bindings are gofmt'd too).
GODIRS  := cmd cells pkg bpf

.PHONY: build run test lint bpf check-bpf bench bench-lb bench-hubble bench-ctgc bench-identity bench-ipcache bench-agent bench-cni docs clean

build:
	$(GO) build -o $(BIN)/agent ./cmd/agent
	$(GO) build -o $(BIN)/cellium-cni ./cmd/cellium-cni

# Runs with embedded defaults: no cluster, no etcd. Extra flags: make run ARGS="--log-level=debug".
run: build
	./$(BIN)/agent run $(ARGS)

test: lint
	$(GO) test -race -count=1 ./...

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
BENCHES := bench-lb bench-agent bench-cni bench-hubble bench-ctgc bench-identity bench-ipcache
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

# The whole agent (as root), built and run as a process with private paths:
# its memory after 60 s idle with default flags in embedded mode
# (`agent-idle-bench ...`), and a first start, restart and stop with 50,000
# Services and EndpointSlices in the manifests directory
# (`agent-scale-bench ...`).
bench-agent:
	@mkdir -p $(BIN)
	$(GO) test ./cmd/agent -run '^$$' -bench 'IdleAgent|Scale' -benchtime 1x -count 1 -timeout 30m | tee $(BIN)/bench-agent.out
	@grep -E '^agent-(idle|scale)-bench' $(BIN)/bench-agent.out

# CNI ADD (as root): 100 pods added at once through the built plugin and
# agent; latency percentiles and the agent's CPU and memory per 1,000 pods.
# Ends with `cni-bench ...`.
bench-cni:
	@mkdir -p $(BIN)
	$(GO) test ./cmd/cellium-cni -run '^$$' -bench AddParallel -benchtime 1x -count 1 | tee $(BIN)/bench-cni.out
	@grep '^cni-bench' $(BIN)/bench-cni.out | tail -n 1

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

# Identity allocation against a real etcd (as root, needs Debian's
# etcd-server): 2,000 new label sets from 32 goroutines, then the same
# again. Ends with `identity-bench ... new_per_s=... known_per_s=...`.
bench-identity:
	@mkdir -p $(BIN)
	$(GO) test ./cells/identity -run '^$$' -bench Allocate -benchtime 1x -count 1 | tee $(BIN)/bench-identity.out
	@grep '^identity-bench' $(BIN)/bench-identity.out | tail -n 1

# ipcache (as root, with etcd-server): 100,000 ip/v1 keys written to etcd
# by another client into the BPF map. Ends with `ipcache-bench ...`.
bench-ipcache:
	@mkdir -p $(BIN)
	$(GO) test ./cells/ipcache -run '^$$' -bench KVStoreToMap -benchtime 1x -count 1 | tee $(BIN)/bench-ipcache.out
	@grep '^ipcache-bench' $(BIN)/bench-ipcache.out | tail -n 1

# Renders the cell graph for docs/architecture.md (needs graphviz).
docs: build
	./$(BIN)/agent hive dot-graph | dot -Tsvg -o docs/cell-graph.svg

clean:
	rm -rf $(BIN)
