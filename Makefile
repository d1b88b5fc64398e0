# Warden — make targets. Everything runs from the Go module proxy alone.
GO      ?= go
BUF     := $(GO) tool -modfile=tools/buf/go.mod buf
STATICCHECK := $(GO) tool -modfile=tools/staticcheck/go.mod staticcheck
DATA    ?= ./data/dev
LISTEN  ?= 127.0.0.1:7070
PKGS    := ./...

.PHONY: all generate check-generate build run cluster cluster-stop test fuzz bench lint clean

all: build

## generate: regenerate the protobuf and Connect code under proto/
generate:
	$(BUF) lint
	$(BUF) generate

## check-generate: fail if the committed generated code is not what generate makes
check-generate: generate
	git diff --exit-code -- proto/

## build: build wardend and warden into bin/
build:
	$(GO) build -o bin/ ./cmd/...

## run: a whole dev cluster in one process (three Raft nodes, zones az1..az3)
run: build
	./bin/wardend --dev --data-dir $(DATA) --listen $(LISTEN)

## cluster: three wardend processes on loopback in zones az1..az3 (deploy/local); cluster-stop stops them
cluster: build
	./deploy/local/cluster.sh start

cluster-stop:
	./deploy/local/cluster.sh stop

## test: vet, then the whole test suite with the race detector
test:
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

## fuzz: a short run of every fuzz target (FUZZTIME each)
FUZZTIME ?= 20s
fuzz:
	$(GO) test ./shard -run '^$$' -fuzz '^FuzzDecodeAndApply$$' -fuzztime $(FUZZTIME)
	$(GO) test ./shard -run '^$$' -fuzz '^FuzzLoadSnapshot$$' -fuzztime $(FUZZTIME)
	$(GO) test ./router -run '^$$' -fuzz '^FuzzValidate$$' -fuzztime $(FUZZTIME)

## bench: acquire+release throughput and latency (1 and 64 clients) and waiter hand-off latency on a dev cluster,
## then, on a three-process cluster, acquire+release before and after a split and reserve+commit
bench:
	$(GO) test ./router -run '^$$' -bench 'AcquireRelease|HandOff' -benchtime 5s -count 3 -timeout 30m
	WARDEN_BENCH=1 $(GO) test ./cmd/wardend -run '^TestClusterThroughput$$' -count 1 -v -timeout 10m

## lint: formatting, vet, staticcheck and the dependency pins of DESIGN.md §7
lint:
	test -z "$$(gofmt -l $$(git ls-files '*.go'))"
	$(GO) vet $(PKGS)
	$(STATICCHECK) $(PKGS)
	./.ci/check-pins

clean:
	rm -rf bin data
