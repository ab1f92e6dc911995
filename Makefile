# Run `make` for the list of targets.
.DEFAULT_GOAL := help

GO      ?= go
# The runqueue package alone takes 6-8 minutes on a shared 2-core machine
# (388 s alone, 472 s beside the other packages in the CI run of
# 2026-12-02); 20m leaves room for a slower machine, and only a hang
# reaches it.
TIMEOUT ?= 20m

# Tests that need a real Redis start their own redis-server when it is on
# PATH (see internal/redistest); RUNQUEUE_REQUIRE_REDIS=1 makes them fail
# instead of skip when there is none.
REQUIRE_REDIS := RUNQUEUE_REQUIRE_REDIS=1

.PHONY: help
help: ## Show this help
	@awk 'BEGIN { FS = ":.*## " } /^[a-zA-Z0-9_\/.-]+:.*## / { printf "  %-18s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

.PHONY: test
test: ## Run all tests (real-Redis tests run when redis-server is on PATH)
	$(GO) test ./... -count=1 -timeout $(TIMEOUT)

# The race detector slows the Lua-heavy tests several times over (./runqueue
# took 14 minutes under it on a shared 2-core machine).
RACE_TIMEOUT ?= 40m

.PHONY: test/race
test/race: ## Run all tests with the race detector
	$(GO) test ./... -count=1 -timeout $(RACE_TIMEOUT) -race

.PHONY: test/redis
test/redis: ## Run the real-Redis tests; fail if no Redis is available
	$(REQUIRE_REDIS) $(GO) test ./... -count=1 -timeout $(TIMEOUT)

# The cluster tests are the Cluster subtests of the tests that run on every
# backend (TestConformance/Cluster/...) and the top-level tests of the
# cluster itself (TestClusterNodes). A plain -run '/Cluster' would also run
# every top-level test without subtests, so clustertests names the tests
# that reach redistest.Cluster and keeps only their Cluster backend.
.PHONY: test/cluster
test/cluster: ## Run the Redis Cluster tests (the Cluster subtests); fail if no Redis is available
	@pattern="$$($(GO) run ./internal/redistest/clustertests)" || exit 1; \
	echo "$(GO) test ./... -run '$$pattern'"; \
	$(REQUIRE_REDIS) $(GO) test ./... -count=1 -timeout $(TIMEOUT) -run "$$pattern"

.PHONY: verify
verify: verify/lua verify/fmt verify/vet ## Run every check: pinned Lua SHAs, gofmt, go vet

.PHONY: verify/lua
verify/lua: ## Check that the flag-off Lua scripts match their pinned SHA-1s
	$(GO) test ./runqueue -run TestFlagOffScriptsPinned -count=1

.PHONY: verify/fmt
verify/fmt: ## Fail if any Go file is not gofmt-ed
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

.PHONY: verify/vet
verify/vet: ## Run go vet
	$(GO) vet ./...

.PHONY: generate/lua-sha
generate/lua-sha: ## Rewrite the pinned Lua SHA-1s and script snapshots (on purpose only)
	RUNQUEUE_UPDATE_GOLDEN=1 $(GO) test ./runqueue -run 'TestFlagOffScriptsPinned|TestScriptSnapshots' -count=1

# golangci-lint is pinned; `make lint` installs this version into
# $(go env GOPATH)/bin when that binary is missing or another version.
GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT := $(shell $(GO) env GOPATH)/bin/golangci-lint

.PHONY: lint
lint: verify/fmt verify/vet lint/install ## gofmt, go vet and golangci-lint (.golangci.yml)
	$(GOLANGCI_LINT) run ./...

.PHONY: lint/install
lint/install: ## Install the pinned golangci-lint into $(go env GOPATH)/bin if missing
	@if ! "$(GOLANGCI_LINT)" version 2>/dev/null | grep -q "version $(patsubst v%,%,$(GOLANGCI_LINT_VERSION)) "; then \
		echo "$(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)"; \
		$(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION); \
	fi

.PHONY: bench
bench: ## Run the benchmark program (go run ./bench)
	$(GO) run ./bench

.PHONY: bench/go
bench/go: ## Run the Go benchmarks of ./runqueue against a real Redis
	$(REQUIRE_REDIS) $(GO) test ./runqueue -run '^$$' -bench . -benchmem -count=5 -timeout $(TIMEOUT)
