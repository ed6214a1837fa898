# DeltaBox developer entry points. Everything installs what it needs: see hack/.
SHELL := /bin/bash
.DEFAULT_GOAL := build
include hack/versions.env

GO          ?= go
PKG         := github.com/deltabox/deltabox
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT      ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS     := -X $(PKG)/internal/version.Version=$(VERSION) -X $(PKG)/internal/version.Commit=$(COMMIT)
BIN         := $(CURDIR)/bin
TEST_FLAGS  ?= -count=1 -p 1 -timeout 30m
export GOFLAGS := -buildvcs=false

# The environment the root and integration tests (and the demo) run in.
CONTAINERD_ADDRESS = $(shell bash hack/containerd.sh address)
# A second private containerd plays a second node in the cross-node snapshot tests.
NODE2_ROOT = /var/lib/deltabox-dev2
CONTAINERD2_ADDRESS = $(shell DELTABOX_DEV_ROOT=$(NODE2_ROOT) bash hack/containerd.sh address)
# A third plays the third node of the multi-node pipeline test on Temporal (integration/scaleout_test.go).
NODE3_ROOT = /var/lib/deltabox-dev3
CONTAINERD3_ADDRESS = $(shell DELTABOX_DEV_ROOT=$(NODE3_ROOT) bash hack/containerd.sh address)
TEST_ENV = DELTABOX_BIN=$(BIN)/deltabox DELTABOX_INIT_BIN=$(BIN)/deltabox-init \
	DELTABOX_CONTAINERD_ADDRESS=$(CONTAINERD_ADDRESS) DELTABOX_CONTAINERD2_ADDRESS=$(CONTAINERD2_ADDRESS) \
	DELTABOX_E2B_NODE_PATH=$(shell bash hack/e2b-sdk.sh path) \
	DELTABOX_CONTAINERD3_ADDRESS=$(CONTAINERD3_ADDRESS) DELTABOX_TEMPORAL=$(shell command -v temporal || echo /usr/local/bin/temporal)

.PHONY: build deps containerd images npm e2b-sdk chromium setup test test-soak test-unit demo bench lint docs clean

# Three builds of the CLI (docs/operations.md, "Binaries"), all three installed side by side:
# bin/deltabox is the fast front (cmd/deltabox-fast: lease and exec without urfave/cli or
# net/http) that hands every other command line to bin/deltabox-cli, the light client build
# (-tags cli: no daemon dependencies); its `daemon` verb runs bin/deltabox-daemon, the full
# build (cmd/deltabox/lite.go). CGO_ENABLED=0: static, so that no dynamic loader and libc run
# at every call. The front is the exception: it carries a C front (cmd/deltabox-fast/cfront.c,
# run from an ELF constructor before the Go runtime starts) that runs lease and exec in ~37
# page faults where the Go runtime's start alone is ~180, so it needs cgo; it is linked
# statically against glibc (libc.a: libc6-dev, from build-essential in hack/install-deps.sh)
# because the dynamic loader costs ~20 faults more per call (58 against 37 for a lease, perf
# stat), and the front calls nothing (NSS, dlopen) that a static glibc warns about.
FAST_LDFLAGS := -linkmode external -extldflags -static
build: ## build bin/deltabox (fast front), bin/deltabox-cli (client), bin/deltabox-daemon and the static sandbox init bin/deltabox-init
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/deltabox-daemon ./cmd/deltabox
	CGO_ENABLED=0 $(GO) build -tags cli,urfave_cli_no_docs -ldflags '$(LDFLAGS)' -o $(BIN)/deltabox-cli ./cmd/deltabox
	CGO_ENABLED=1 $(GO) build -ldflags '$(LDFLAGS) $(FAST_LDFLAGS)' -o $(BIN)/deltabox ./cmd/deltabox-fast
	@if [ -f cmd/deltabox-init/main.go ]; then \
		CGO_ENABLED=0 $(GO) build -ldflags '-s -w $(LDFLAGS)' -o $(BIN)/deltabox-init ./cmd/deltabox-init; fi

deps: ## install pinned containerd, runc, CRIU, CNI plugins, versitygw, the Temporal CLI (idempotent)
	bash hack/install-deps.sh
	bash hack/install-temporal.sh

containerd: deps ## start the private containerd used by tests and the demo
	bash hack/containerd.sh start

images: containerd ## build and import the busybox and python images (into the three private containerds)
	bash hack/images.sh
	DELTABOX_DEV_ROOT=$(NODE2_ROOT) bash hack/containerd.sh start
	DELTABOX_DEV_ROOT=$(NODE2_ROOT) bash hack/images.sh
	DELTABOX_DEV_ROOT=$(NODE3_ROOT) bash hack/containerd.sh start
	DELTABOX_DEV_ROOT=$(NODE3_ROOT) bash hack/images.sh

setup: deps containerd images npm e2b-sdk chromium

chromium: ## install Debian's chromium for the headless browser test of deltabox ui
	bash hack/chromium.sh

npm: ## install the pinned npm dependencies of sdk/typescript and sdk/langgraph and build them
	bash hack/npm.sh

e2b-sdk: ## install the pinned e2b JS SDK the E2B-compatibility tests run (integration/e2b)
	bash hack/e2b-sdk.sh

# -p 1: packages one at a time; the root tests of several packages share containerd, iptables
# and CRIU's network lock, and their timings are tuned for a machine they have to themselves.
# Packages whose concurrency (the change tracker, the effect journal, the state log's group
# commit, the init's streams) also runs under the race detector.
RACE_PKGS := ./overlay/ ./proxy/ ./orchestrator/ ./orchestrator/state/ ./pool/initproto/ ./orchestrator/e2b/

test: setup build ## unit, root and integration tests against the real stack
	$(TEST_ENV) $(GO) test $(TEST_FLAGS) ./...
	$(TEST_ENV) $(GO) test -count=1 -race $(RACE_PKGS)

# The soak of issue 12: DELTABOX_SOAK_SANDBOXES sandboxes x DELTABOX_SOAK_DURATION of steps with
# the daemon killed (SIGKILL) every ~20 s. `make test` runs a 3 x 20 s version of it.
DELTABOX_SOAK_SANDBOXES ?= 15
DELTABOX_SOAK_DURATION  ?= 3m
test-soak: setup build ## the kill -9 soak: 15 sandboxes x 3 min (DELTABOX_SOAK_SANDBOXES, DELTABOX_SOAK_DURATION)
	$(TEST_ENV) DELTABOX_SOAK_SANDBOXES=$(DELTABOX_SOAK_SANDBOXES) DELTABOX_SOAK_DURATION=$(DELTABOX_SOAK_DURATION) \
		$(GO) test -count=1 -timeout 60m -v -run '^TestSoakKill9$$' ./integration/

test-unit: ## unit tests only (no root, no containerd)
	$(GO) test -count=1 -short ./...

demo: setup build ## run the demo against a fresh daemon
	$(TEST_ENV) bash hack/demo.sh

bench: setup build ## run the benchmarks and write docs/benchmarks.md
	$(TEST_ENV) bash hack/bench.sh

lint: ## gofmt, go mod tidy (go.mod/go.sum must not change), go vet, staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@$(GO) mod tidy -diff || { echo "go.mod/go.sum are not tidy: run go mod tidy"; exit 1; }
	$(GO) vet ./...
	staticcheck ./...

docs: build ## regenerate docs/cli.md from the CLI
	$(BIN)/deltabox-daemon docs > docs/cli.md

clean:
	rm -rf $(BIN)
