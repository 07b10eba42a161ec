# Sortie: mission-driven edge agent. `make run` for the demo, `make test`
# for the tests.
GO          ?= go
PKGS        ?= ./...
TIMEOUT     ?= 9m
ENABLE_RACE ?= true
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION    ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS     := -s -w -X main.Version=$(VERSION) -X main.Revision=$(REVISION)
# The shipped agent leaves out net/http's HTTP/2 (its API speaks HTTP/1.1
# to the LAN; 0.44 MiB of the arm64 binary) and the demo's simulator (a
# gateway runs none; 0.31 MiB), which its budget needs since
# prometheus/client_golang came back (README, ARM gateways).
AGENT_TAGS  := nethttpomithttp2,nosim
BENCHTIME   ?= 2s

ifeq ($(ENABLE_RACE),true)
RACE := -race
# A race-detecting binary sleeps a second at its exit (atexit_sleep_ms)
# for other threads to finish a report: 45 test binaries, about 20 s of
# make test on 2 cores. A race is still reported, and fails its test.
export GORACE := $(GORACE) atexit_sleep_ms=0
endif

.PHONY: all fmt fmt-check vet lint test lockorder cluster-test build run run-mixed demo-hub sim cross bench bench-load clean

all: build

fmt:
	gofmt -w .

fmt-check:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

# golangci-lint, built from the version pinned in tools/go.mod (its own
# module, so the agent's go.mod carries none of its dependencies).
GOLANGCI := bin/golangci-lint

$(GOLANGCI): tools/go.mod tools/go.sum
	@mkdir -p bin
	$(GO) -C tools build -o ../$(GOLANGCI) github.com/golangci/golangci-lint/v2/cmd/golangci-lint

lint: fmt-check vet $(GOLANGCI)
	$(GOLANGCI) run $(PKGS)

# The README's test command: lint (format check, vet, golangci-lint), then
# every test under -race. CI runs it, so a lint finding fails CI.
test: lint
	$(GO) test $(RACE) -count=1 -timeout $(TIMEOUT) $(PKGS)

# The store's tests in a build that checks the lock order of store.DB at
# every Lock (store/lockorder.go). CI runs it after make test.
lockorder:
	$(GO) test -tags lockorder -count=1 -timeout $(TIMEOUT) ./store/...

# The cluster mode (docs/cluster.md) on real NATS nodes and PostgreSQL,
# the chaos test among them, with their counts printed. make test runs
# them too.
cluster-test:
	$(GO) test $(RACE) -count=1 -timeout $(TIMEOUT) -v -run 'TestCluster|TestPGStore|TestChain|TestControlRepeated|TestNATS|TestStream|TestMQTT|TestPostgres' ./hub ./internal/clustertest

build:
	@mkdir -p bin
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/ ./cmd/...

# The demo: the agent with its embedded broker and a simulated home, then
# go_home triggered and followed step by step. Ctrl-C stops it cleanly.
# RUN_FLAGS go to `agent run`: a port taken, for one
# (RUN_FLAGS='-broker-listen 127.0.0.1:1893 -http 127.0.0.1:8081').
RUN_FLAGS ?=
run: build
	./bin/agent run -config configs/agent.toml -progress -trigger go_home -log-level warn $(RUN_FLAGS)

# The mixed demo: native devices beside Zigbee2MQTT ones (docs/devices.md),
# go_home triggered and followed step by step.
run-mixed: build
	./bin/agent run -config configs/mixed/agent.toml -progress -trigger go_home -log-level warn $(RUN_FLAGS)

# The hub (its embedded broker on 127.0.0.1:1884, dashboard on
# http://127.0.0.1:8090/?token=demo-token-change-me) and the demo agent
# syncing to it. Ctrl-C stops both: the agent first (the hub runs in a
# session of its own, out of the terminal's Ctrl-C), so that it can tell
# the hub it is going offline, then the hub.
demo-hub: build
	@setsid ./bin/hub run -config configs/hub.toml -log-level warn & hub=$$!; trap "kill $$hub 2>/dev/null" EXIT; trap "" INT; \
	sleep 1; echo "Hub dashboard: http://127.0.0.1:8090/?token=demo-token-change-me"; \
	SORTIE_HUB_PASSWORD=home-demo-password ./bin/agent run -config configs/agent.toml \
	  -hub tcp://127.0.0.1:1884 -progress -trigger go_home -log-level warn $(RUN_FLAGS)

# The simulated home alone, against the broker given by BROKER (default:
# its own embedded broker).
sim: build
	./bin/sim -config configs/home.toml $(if $(BROKER),-broker $(BROKER))

# Static, stripped binaries for ARM gateways.
cross:
	@mkdir -p dist
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build -trimpath -tags $(AGENT_TAGS) -ldflags '$(LDFLAGS)' -o dist/agent-linux-arm64 ./cmd/agent
	CGO_ENABLED=0 GOOS=linux GOARCH=arm GOARM=7 $(GO) build -trimpath -tags $(AGENT_TAGS) -ldflags '$(LDFLAGS)' -o dist/agent-linux-armv7 ./cmd/agent
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o dist/hub-linux-arm64 ./cmd/hub
	CGO_ENABLED=0 GOOS=linux GOARCH=arm GOARM=7 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o dist/hub-linux-armv7 ./cmd/hub
	@ls -l dist | awk 'NR>1 {printf "%-24s %6.1f MiB\n", $$9, $$5/1048576}'

# Benchmarks, each reporting its figures beside a raw baseline measured in
# the same run; prints a Markdown table at the end (raw output on stderr).
# The agent package's benchmarks run a whole agent against hundreds of
# simulated devices, seconds each, and the hub's cluster benchmarks run
# NATS nodes and PostgreSQL for a minute or so (skipped without them):
# they run once (-benchtime 1x), as does the fleet's (1,000 gateways
# against the hub binary; FLEET_GATEWAYS=10000 for the issue's scale).
# The dashboard's load (BenchmarkDashboardLoad, headless Chromium on
# bbolt and PostgreSQL stores filled with a fleet's month) runs once
# too, at 1,000 gateways and 100,000 missions; `make bench-load` runs it
# alone at the issue's scale (10,000 and 1,000,000: the first fill takes
# 20 min on bbolt, 5 min on PostgreSQL, on 2 busy cores, then is reused
# from $TMPDIR/sortie-load for 6 hours).
CLUSTER_BENCH := ClusterIngest|ReconnectStorm
LOAD_BENCH    := DashboardLoad
FLEET_GATEWAYS ?= 1000
LOAD_GATEWAYS ?= 1000
LOAD_MISSIONS ?= 100000

bench:
	{ $(GO) test -run '^$$' -bench . -skip '$(CLUSTER_BENCH)|$(LOAD_BENCH)' -benchtime $(BENCHTIME) $$($(GO) list $(PKGS) | grep -v -e '/sortie/agent$$' -e '/internal/fleetsim$$'); \
	  $(GO) test -run '^$$' -bench . -benchtime 1x ./agent/; \
	  $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 20m ./internal/fleetsim/ -args -fleet-gateways $(FLEET_GATEWAYS); \
	  $(GO) test -run '^$$' -bench '$(CLUSTER_BENCH)' -benchtime 1x -timeout 10m ./hub/; \
	  SORTIE_LOAD_GATEWAYS=$(LOAD_GATEWAYS) SORTIE_LOAD_MISSIONS=$(LOAD_MISSIONS) $(GO) test -run '^$$' -bench '$(LOAD_BENCH)' -benchtime 1x -timeout 90m ./hub/; } 2>&1 | $(GO) run ./internal/benchtable

bench-load:
	SORTIE_LOAD_GATEWAYS=10000 SORTIE_LOAD_MISSIONS=1000000 $(GO) test -run '^$$' -bench '$(LOAD_BENCH)' -benchtime 1x -timeout 120m ./hub/ 2>&1 | $(GO) run ./internal/benchtable

clean:
	rm -rf bin dist
