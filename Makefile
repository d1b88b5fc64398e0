# Warden — make targets. Everything runs from the Go module proxy alone.
GO      ?= go
BUF     := $(GO) tool -modfile=tools/buf/go.mod buf
STATICCHECK := $(GO) tool -modfile=tools/staticcheck/go.mod staticcheck
DATA    ?= ./data/dev
LISTEN  ?= 127.0.0.1:7070
PKGS    := ./...
# The repository's Go modules besides the server's (the root): the SDK, the
# public API it shares with the server, the load harness, and the
# Kubernetes manifests' tests (k8s.io/api). A root `go test ./...` skips them.
MODULES := client proto loadtest deploy/kubernetes
# npm installs exactly what each package-lock.json pins.
NPM_CI := npm ci --no-audit --no-fund --loglevel=error
# VERSION is what wardend --version and ListNodes show: the nearest tag
# and the commit (git describe), "dev" outside a git checkout.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

.PHONY: all generate check-generate ui test-js bench-sdk build image-bin image run cluster cluster-stop test soak nemesis fuzz bench loadtest loadtest-secure loadtest-compare lint clean

all: build

## generate: regenerate the protobuf and Connect code under proto/, and the TypeScript SDK's (clients/typescript/src/gen,
## by protoc-gen-es pinned in its package.json)
generate:
	$(BUF) lint
	$(BUF) generate
	cd clients/typescript && $(NPM_CI)
	$(BUF) generate --template clients/typescript/buf.gen.yaml --path proto/warden/v1

## ui: rebuild the dashboard's committed assets (ui/dist, embedded in wardend) from ui/src and the TypeScript SDK
ui:
	cd ui && $(NPM_CI) && npm run build

## check-generate: fail if the committed generated code and dashboard assets are not what generate and ui make
check-generate: generate ui
	git diff --exit-code -- proto/ clients/typescript/src/gen ui/dist
	test -z "$$(git status --porcelain -- proto/ clients/typescript/src/gen ui/dist)"

## build: build wardend and warden into bin/
build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o bin/ ./cmd/...

## image-bin: static wardend and warden (CGO_ENABLED=0) and an empty data directory in bin/image/, what the
## Containerfile copies (then `docker build -f Containerfile .` works too)
image-bin:
	rm -rf bin/image && mkdir -p bin/image/data
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o bin/image/ ./cmd/wardend ./cmd/warden

## image: the OCI image IMAGE (default localhost/warden:VERSION), FROM scratch, built offline by buildah
IMAGE ?= localhost/warden:$(VERSION)
image: image-bin
	buildah build --isolation chroot --layers=false -f Containerfile -t $(IMAGE) .

## run: a whole dev cluster in one process (three Raft nodes, zones az1..az3)
run: build
	./bin/wardend --dev --data-dir $(DATA) --listen $(LISTEN)

## cluster: three wardend processes on loopback in zones az1..az3 (deploy/local); cluster-stop stops them
cluster: build
	./deploy/local/cluster.sh start

cluster-stop:
	./deploy/local/cluster.sh stop

## test: vet, then the whole test suite with the race detector (with the nemesis's short run, which needs root: without
## it, it skips saying why; CI=true fails), in every module (the SDK in client/, the API in proto/,
## the load harness in loadtest/, whose etcd and ZooKeeper adapter tests skip when those servers are not installed,
## unless WARDEN_PEER_TESTS=1), the deployment artifacts' tests (deploy/: the image, systemd, Kubernetes, compose,
## monitoring; verbose, so that a test this machine cannot run says why it skipped; CI=true fails instead), the
## check that the SDK pulls none of the server's dependencies, and the README's cap (300 lines) and links (.ci/check-readme)
test:
	./.ci/check-readme
	$(GO) vet $(PKGS)
	for m in $(MODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done
	$(GO) test -race -count=1 -timeout 30m $$($(GO) list $(PKGS) | grep -v '/deploy/')
	cd proto && $(GO) test -race -count=1 -timeout 5m ./...
	cd client && $(GO) test -race -count=1 -timeout 5m ./...
	cd loadtest && $(GO) test -race -count=1 -timeout 10m ./...
	$(GO) test -count=1 -v -timeout 15m ./deploy/...
	cd deploy/kubernetes && $(GO) test -count=1 -v -timeout 5m ./...
	./.ci/check-sdk-deps
	$(MAKE) test-js

## test-js: the TypeScript SDK's type check and tests (Node's test runner, against wardend processes it starts), and
## the dashboard's browser tests (Debian's Chromium, driven by playwright-core); without npm or Chromium they skip
## saying why, except under CI=true, where they fail
test-js: build
	@if ! command -v npm >/dev/null; then \
		if [ "$$CI" = true ]; then echo "test-js: npm not found (.ci/run installs nodejs and npm)"; exit 1; fi; \
		echo "SKIP test-js: npm not found: the TypeScript SDK and dashboard tests did not run (apt-get install nodejs npm)"; exit 0; fi; \
	cd clients/typescript && $(NPM_CI) && npm run typecheck && npm test && \
	cd ../../ui && $(NPM_CI) && npm run typecheck && npm test

## soak: the long cases of shared/cases at full scale (make test runs them reduced), the long nemesis and 2,000 seeds of the
## routing simulation (router/sim_test.go); bounded by -timeout
soak: nemesis
	WARDEN_SOAK=1 $(GO) test ./rpc -run '^(TestMassExpiry|TestCaseS2LinearizableAcrossSplits)$$' -count=1 -v -timeout 30m
	$(GO) test ./router -run '^TestSimulatedShard$$' -count=1 -timeout 30m -args -sim.seeds=2000
	$(GO) test ./rpc -run '^TestSimulatedAPI$$' -count=1 -timeout 30m -args -api.seeds=500
	WARDEN_SOAK=1 $(GO) test ./cmd/wardend -run '^(TestClusterCaseL17ChurningWaiters|TestClusterCaseS1TokensThroughChurn|TestClusterCaseQ14CountersEqualTheLedger)$$' -count=1 -v -timeout 45m

## nemesis: the fault suite's long run (as root): every fault three times against three wardend processes in network
## namespaces under load, the history checked, and a table per fault (DESIGN.md §5; WARDEN_NEMESIS_SEED replays a run);
## make test runs a short one
nemesis:
	WARDEN_NEMESIS=long $(GO) test ./nemesis -run '^TestNemesis$$' -count=1 -v -timeout 30m

## fuzz: a short run of every fuzz target (FUZZTIME each)
FUZZTIME ?= 20s
fuzz:
	$(GO) test ./shard -run '^$$' -fuzz '^FuzzDecodeAndApply$$' -fuzztime $(FUZZTIME)
	$(GO) test ./shard -run '^$$' -fuzz '^FuzzLoadSnapshot$$' -fuzztime $(FUZZTIME)
	$(GO) test ./rpc -run '^$$' -fuzz '^FuzzValidate$$' -fuzztime $(FUZZTIME)
	$(GO) test ./rpc -run '^$$' -fuzz '^FuzzDecodeCursor$$' -fuzztime $(FUZZTIME)
	$(GO) test ./placement -run '^$$' -fuzz '^FuzzMetaUpdate$$' -fuzztime $(FUZZTIME)
	$(GO) test ./placement -run '^$$' -fuzz '^FuzzJobCommands$$' -fuzztime $(FUZZTIME)
	$(GO) test ./auth -run '^$$' -fuzz '^FuzzParseToken$$' -fuzztime $(FUZZTIME)
	$(GO) test ./auth -run '^$$' -fuzz '^FuzzParseBootstrap$$' -fuzztime $(FUZZTIME)
	$(GO) test ./cmd/wardend -run '^$$' -fuzz '^FuzzConfigFile$$' -fuzztime $(FUZZTIME)
	$(GO) test ./server -run '^$$' -fuzz '^FuzzDecodeChunks$$' -fuzztime $(FUZZTIME)
	$(GO) test ./server -run '^$$' -fuzz '^FuzzParseCORSOrigins$$' -fuzztime $(FUZZTIME)

## bench: acquire+release throughput and latency (1 and 64 clients) and waiter hand-off latency on a dev cluster,
## then, on a three-process cluster, acquire+release before and after a split and reserve+commit, in cleartext
## and again with TLS and authentication on, and a restarted node's time to serve every shard with 1, 16 and 64 shards
bench:
	$(GO) test ./rpc -run '^$$' -bench 'AcquireRelease|HandOff' -benchtime 5s -count 3 -timeout 30m
	WARDEN_BENCH=1 $(GO) test ./cmd/wardend -run '^TestClusterThroughput$$' -count 1 -v -timeout 10m
	WARDEN_BENCH=1 WARDEN_BENCH_SECURE=1 $(GO) test ./cmd/wardend -run '^TestClusterThroughput$$' -count 1 -v -timeout 10m
	for n in 1 16 64; do WARDEN_RESTART_SHARDS=$$n WARDEN_RESTART_ROUNDS=3 $(GO) test ./cmd/wardend -run '^TestClusterRestartServingShards$$' -count 1 -v -timeout 30m || exit 1; done

## bench-sdk: the lock round trip (lock, then unlock) of the Go SDK and of the TypeScript SDK from Node.js, against one
## wardend --dev, in the same run (N pairs each, default 2000)
bench-sdk: build
	cd clients/typescript && $(NPM_CI)
	./clients/typescript/bench/compare.sh

## loadtest: the reference profile for 60 s on a three-process cluster, one replica SIGKILLed at 30 s,
## snapshot and log compaction forced at 35 s, restart at 50 s; writes loadtest/out/report.{json,md} and chart.png
loadtest:
	./loadtest/run.sh

## loadtest-secure: the same over TLS with authentication on (cluster.sh start --secure, the admin token);
## writes loadtest/out-secure/
loadtest-secure:
	LOADTEST_SECURE=1 LOADTEST_OUT=$(CURDIR)/loadtest/out-secure ./loadtest/run.sh

## loadtest-compare: find-max of the reference profile on Warden, etcd (two recipes) and ZooKeeper, one after
## the other, three times (LOADTEST_RUNS); writes loadtest/out/compare.md with each target's median run, the ratios and the costs
loadtest-compare:
	./loadtest/compare.sh

## lint: formatting, vet, staticcheck, the dependency pins of DESIGN.md §7, the forbidden imports of §2, and buf breaking
## with the log-format rule (a changed log-format proto raises a command version)
lint:
	test -z "$$(gofmt -l $$(git ls-files '*.go'))"
	$(GO) vet $(PKGS)
	$(STATICCHECK) $(PKGS)
	for m in $(MODULES); do (cd $$m && $(GO) vet ./... && $(GO) tool -modfile=$(CURDIR)/tools/staticcheck/go.mod staticcheck ./...) || exit 1; done
	./.ci/check-pins
	./.ci/check-imports
	./.ci/check-proto

clean:
	rm -rf bin data
