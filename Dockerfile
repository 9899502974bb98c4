# syntax=docker/dockerfile:1
# profi image for places that reach a registry: built where a Docker engine
# runs (`make docker-build`). Our CI machines reach no registry and run no
# Docker daemon; they build the same image from the Containerfile (FROM
# scratch, the agent, the glibc it links and Debian's CA bundle, assembled by
# scripts/build-image.sh with buildah) and run it under podman with the
# chart's securityContext, counting a host workload exactly
# (test/e2e/image_test.go). Keep the two in step: same binary flags, same
# user, entrypoint and port, nothing writable needed.
#
# Build stage: Go with cgo, because the NVML poller uses go-nvml
# (internal/nvml, build tags linux && cgo), which loads libnvidia-ml.so.1 at
# run time; the NVIDIA container runtime injects that library. Both
# architectures (`docker buildx build --platform linux/amd64,linux/arm64`):
# the stage runs on the build machine's platform and cross-compiles with
# Debian's cross gcc, no emulation.
FROM --platform=$BUILDPLATFORM golang:1.26-bookworm AS build
ARG TARGETARCH BUILDARCH
RUN if [ "$TARGETARCH" != "$BUILDARCH" ]; then \
      case $TARGETARCH in \
        arm64) pkgs="gcc-aarch64-linux-gnu libc6-dev-arm64-cross" ;; \
        amd64) pkgs="gcc-x86-64-linux-gnu libc6-dev-amd64-cross" ;; \
        *) echo "profi builds for amd64 and arm64, not $TARGETARCH" >&2; exit 1 ;; \
      esac; \
      apt-get update && apt-get install -y --no-install-recommends $pkgs && rm -rf /var/lib/apt/lists/*; \
    fi
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    case $TARGETARCH in \
      "$BUILDARCH") cc=gcc ;; arm64) cc=aarch64-linux-gnu-gcc ;; amd64) cc=x86_64-linux-gnu-gcc ;; \
    esac; \
    CC=$cc GOARCH=$TARGETARCH CGO_ENABLED=1 CGO_CFLAGS=-Wno-deprecated-declarations \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/profi ./cmd/profi

# Runtime: distroless base (glibc, CA certificates, no shell, no package
# manager). No curl or wget: NOTES.txt uses kubectl port-forward instead.
#
# The agent runs as uid 0 with all capabilities dropped except BPF, PERFMON
# and SYS_PTRACE (the chart's securityContext). A non-root uid would need
# file capabilities on the binary plus allowPrivilegeEscalation, which is a
# larger grant than root without capabilities; so the image stays root by
# default and the chart drops everything else.
FROM gcr.io/distroless/base-debian12
COPY --from=build /out/profi /usr/bin/profi
USER 0:0
EXPOSE 9401
ENTRYPOINT ["/usr/bin/profi"]
