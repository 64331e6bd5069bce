# syntax=docker/dockerfile:1
#
# ratchet's container image: a fully static binary (musl, librdkafka linked
# in) on distroless/static, running as a non-root user.
#
#   docker build -t ratchet:local .          (or: make image)
#   docker build --build-arg VERSION=v1.2.3 -t ratchet:v1.2.3 .
#
# The builder runs `make -f mk/image.mk image-binary`, the same target a
# developer runs locally, so the binary in the image is built exactly like the
# one the tests build and run against a broker and PostgreSQL. That target is
#
#   CC=musl-gcc CGO_ENABLED=1 go build -trimpath -tags musl \
#     -ldflags '-linkmode external -extldflags "-static" -s -w -X ratchet/internal/cli.Version=$(VERSION)' \
#     -o $(STATIC_BIN) ./cmd/ratchet
#
# and it fails unless the result is statically linked. cgo is required
# (confluent-kafka-go wraps librdkafka); `-tags musl` selects the bundled musl
# build of librdkafka, which links fully static with musl-gcc. The default
# glibc build would need glibc in the runtime image.
#
# Cache mounts need BuildKit, the default builder of current Docker releases.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=devel
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    make -f mk/image.mk image-binary STATIC_BIN=/out/ratchet VERSION="${VERSION}" \
 && /out/ratchet version

# distroless/static: CA certificates, /etc/passwd with the nonroot user
# (65532), tzdata, and no shell. librdkafka finds the CA bundle at
# /etc/ssl/certs/ca-certificates.crt for TLS listeners.
FROM gcr.io/distroless/static-debian12:nonroot
LABEL org.opencontainers.image.title="ratchet" \
      org.opencontainers.image.description="Actor-based Kafka to PostgreSQL stream processing engine"
COPY --from=build /out/ratchet /ratchet
# http.addr defaults to 127.0.0.1:8080, which probes from outside the
# container cannot reach. /metrics, /healthz, /readyz and the page share it.
ENV RATCHET_HTTP_ADDR=0.0.0.0:8080
EXPOSE 8080
USER 65532:65532
# No HEALTHCHECK: the image has no shell and no HTTP client. Orchestrators
# probe over HTTP instead: liveness GET /healthz, readiness GET /readyz.
ENTRYPOINT ["/ratchet"]
CMD ["run"]
