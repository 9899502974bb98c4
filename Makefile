# profi: build, test and demo. `make build` needs only Go: the BPF object
# is generated ahead of time and committed (internal/bpfobj/*_bpfel.*).

GO       ?= go
BIN      := bin/profi
VERSION  ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

.PHONY: node all build test test-setup test-vm test-unit generate lint fmt demo bench bench-setup bench-scale bench-all clean chart-check image docker-build docker-push

all: build

build:
	$(GO) build -trimpath -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/profi

# The full suite: unit tests plus the end-to-end tests that load and attach
# real BPF programs (root needed; PROFI_E2E=1 turns their skip into a failure).
# -p 1: the e2e agents probe every libcudart on the machine, and the latency
# histograms carry no pid, so no other package's workloads may run meanwhile.
# What the tests need on a fresh machine (Debian packages, kube-apiserver
# and helm built into the tools cache, NVIDIA's runtime, driver and NVTX
# libraries fetched there), or one line saying what is missing.
test-setup:
	bash scripts/test-setup.sh

# test/vm is the VM kernel matrix (docs/KERNELS.md): Debian's cloud kernels
# under qemu, the VMs side by side, one core each (its time: docs/KERNELS.md).
test: test-setup
	$(GO) vet ./...
	$(GO) test -p 1 -count=1 -timeout 30m ./...

# A single-node Kubernetes (kubelet, containerd, CNI bridge; the one
# test/e2e/node_test.go runs) with the chart installed and a workload pod,
# left running for a person to look at; it prints how to reach it, and
# Ctrl-C removes it. Root needed.
node: test-setup
	PROFI_E2E=1 $(GO) test -tags profi_node -count=1 -v -timeout 0 -run '^TestNodeForAPerson$$' ./test/e2e/

# The VM kernel matrix alone, each step's result and time.
test-vm: test-setup
	$(GO) test -count=1 -v -timeout 30m -run TestKernelMatrix ./test/vm/

test-unit:
	$(GO) test -count=1 -short ./internal/...

generate:
	$(GO) generate ./internal/ops # ops.h first: the BPF objects compile against it
	cd internal/bpfobj && $(GO) generate ./...

lint:
	@test -z "$$(gofmt -l .)" || (gofmt -l . && echo "gofmt: files above need formatting" && exit 1)
	$(GO) vet ./...
	@if command -v golangci-lint >/dev/null; then golangci-lint run ./...; else echo "golangci-lint not installed: skipped"; fi
	@if command -v clang-format >/dev/null; then clang-format --dry-run --Werror bpf/*.c bpf/*.h bpf/arch/*.h; else echo "clang-format not installed: skipped"; fi

fmt:
	gofmt -w .
	@if command -v clang-format >/dev/null; then clang-format -i bpf/*.c bpf/*.h bpf/arch/*.h; fi

# Builds profi and the stub workload, runs both, prints a live table.
demo: build
	./scripts/demo.sh

# Probe overhead on the stub library, all configurations in one run (root
# needed; about a minute): ns per call and ratios to an empty uprobe. See
# docs/BENCHMARK.md. PROFI_E2E=1 makes a missing privilege fail, not skip.
# bpftrace, the baseline of the per-hit targets, comes from Debian.
bench: bench-setup
	PROFI_E2E=1 $(GO) test -run '^$$' -bench Overhead -benchtime 1x -count 1 -timeout 20m ./bench/

bench-setup:
	@command -v bpftrace >/dev/null || { apt-get update -qq && apt-get install -y -qq bpftrace >/dev/null; }

# Attach latency (100 short processes, library-load trigger only) and the
# agent's userspace cost against call rate and series count (CPU, RSS,
# scrape latency), with the real binary; root needed, several minutes.
# Results: docs/BENCHMARK.md.
bench-scale:
	PROFI_E2E=1 $(GO) test -run '^$$' -bench 'AttachLatency|ScaleCost' -benchtime 1x -count 1 -timeout 30m ./bench/

clean:
	rm -rf bin

# Every benchmark of docs/BENCHMARK.md in one command (about 15 minutes).
bench-all: bench bench-scale

# The Helm chart deploy/profi against real tools: helm lint --strict and
# template, server-side dry-run on a real kube-apiserver, promtool rule unit
# tests, the Grafana dashboard and every queried metric name. See
# scripts/chart-check.sh (builds and caches helm on first use, ~6 minutes).
chart-check:
	./scripts/chart-check.sh

# The container image without a registry or a Docker daemon: buildah on the
# Containerfile, FROM scratch plus the agent, the glibc it links and Debian's
# CA bundle (scripts/build-image.sh), for x86-64 and arm64 (IMAGE:VERSION-amd64,
# -arm64) under one manifest list IMAGE:VERSION. CI builds them, runs the
# x86-64 one under podman with the chart's securityContext
# (test/e2e/image_test.go) and the arm64 one under qemu-user
# (test/e2e/image_arch_test.go).
image:
	./scripts/build-image.sh --manifest $(IMAGE):$(VERSION) --version $(VERSION)

# The container image (Dockerfile): needs a Docker engine with buildx, which
# our CI machines do not have. IMAGE defaults to the chart's image.repository.
IMAGE ?= ghcr.io/profi-dev/profi
# docker-build builds this machine's architecture into the local engine;
# docker-push builds both and pushes them under one manifest list.
docker-build:
	docker buildx build --load --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION) .

docker-push:
	docker buildx build --push --platform linux/amd64,linux/arm64 --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION) .
