# Run `make` for the list of targets.
.DEFAULT_GOAL := help

GO      ?= go
# The runqueue package took 12 minutes in one process on a shared 2-core
# machine (712 s, 2026-12-05), about 6.5 split as test does (split_test);
# 20m leaves room for a slower machine, and only a hang reaches it.
TIMEOUT ?= 20m

# Tests that need a real Redis start their own redis-server when it is on
# PATH (see internal/redistest); RUNQUEUE_REQUIRE_REDIS=1 makes them fail
# instead of skip when there is none.
REQUIRE_REDIS := RUNQUEUE_REQUIRE_REDIS=1

.PHONY: help
help: ## Show this help
	@awk 'BEGIN { FS = ":.*## " } /^[a-zA-Z0-9_\/.-]+:.*## / { printf "  %-18s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

# split_test runs every test of the module in two go test processes side by
# side, with the flags $(1): the serial tests of ./runqueue (its top-level
# tests that do not call t.Parallel, listed by internal/redistest/
# serialtests) in one, everything else (the same pattern as -skip) in the
# other. go test runs a package's serial tests one after another before any
# of its parallel tests starts, and runqueue's mostly wait (servers paused,
# killed or restarted, leases and TTLs passing): in one process they kept 26%
# of 2 cores busy for the first 5 of the package's 12 minutes (2026-12-05,
# 712 s; side by side both processes passed in 379 s). Each process keeps
# Go's order among its own tests and spawns its own servers. The serial
# process's output follows the other's (also when interrupted), then a line
# that says whether both passed; the status is that of both.
define split_test
@pattern="$$($(GO) run ./internal/redistest/serialtests ./runqueue)" || exit 1; \
	log="$$(mktemp)"; \
	echo "$(GO) test ./runqueue $(1) -run \"\$$($(GO) run ./internal/redistest/serialtests ./runqueue)\", beside:"; \
	echo "$(GO) test ./... $(1) -skip <the same pattern>"; \
	$(GO) test ./runqueue $(1) -run "$$pattern" > "$$log" 2>&1 & serial=$$!; \
	$(GO) test ./... $(1) -skip "$$pattern" & others=$$!; \
	trap 'kill $$serial $$others 2>/dev/null; wait; echo "--- the serial tests of ./runqueue (interrupted)"; cat "$$log"; rm -f "$$log"; exit 130' INT TERM HUP; \
	wait $$others; rest=$$?; wait $$serial; s=$$?; trap - INT TERM HUP; \
	echo "--- the serial tests of ./runqueue"; cat "$$log"; rm -f "$$log"; \
	if [ $$rest -eq 0 ] && [ $$s -eq 0 ]; then echo "ok: every test passed (the rest and the serial tests of ./runqueue)"; \
	else echo "FAIL: the rest exited $$rest, the serial tests of ./runqueue $$s"; exit 1; fi
endef

.PHONY: test
test: ## Run all tests (real-Redis tests run when redis-server is on PATH)
	$(call split_test,-count=1 -timeout $(TIMEOUT))

# The race detector slows the Lua-heavy tests several times over (./runqueue
# took 14 minutes under it on a shared 2-core machine).
RACE_TIMEOUT ?= 40m

.PHONY: test/race
test/race: ## Run all tests with the race detector
	$(call split_test,-count=1 -timeout $(RACE_TIMEOUT) -race)

.PHONY: test/redis
test/redis: ## Run the real-Redis tests; fail if no Redis is available
	@RUNQUEUE_REQUIRE_REDIS=1 $(MAKE) --no-print-directory test

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
