# mk/image.mk: the fully static binary and the container image.
#
# Included by the Makefile; it also works on its own:
#   make -f mk/image.mk image-binary [STATIC_BIN=path] [VERSION=v1.2.3]
#
# image-binary  builds bin/ratchet-static, statically linked (musl, librdkafka
#               bundled), and fails unless it really is static. Needs musl-gcc
#               (Debian: apt-get install musl-tools), installed here when
#               running as root with apt-get, else the command is printed.
#               The Dockerfile's builder runs this very target.
# image         docker build of the Dockerfile. Needs a running Docker engine.
#
# Recipes are POSIX sh so the fragment works with or without SHELL=bash.

GO         ?= go
DOCKER     ?= docker
STATIC_BIN ?= bin/ratchet-static
IMAGE      ?= ratchet:local
VERSION    ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)

# cgo is required (CGO_ENABLED=0 does not compile confluent-kafka-go);
# -tags musl picks the bundled musl librdkafka, which links fully static only
# with musl-gcc. A glibc -static build links but warns about dlopen and
# getpwuid_r; it is not used.
STATIC_TAGS    := musl
STATIC_LDFLAGS := -linkmode external -extldflags "-static" -s -w -X ratchet/internal/cli.Version=$(VERSION)

.PHONY: image-binary image musl-tools

## image-binary: the fully static binary bin/ratchet-static (what the image runs).
image-binary: musl-tools
	@mkdir -p $(dir $(STATIC_BIN))
	CC=musl-gcc CGO_ENABLED=1 $(GO) build -trimpath -tags $(STATIC_TAGS) -ldflags '$(STATIC_LDFLAGS)' -o $(STATIC_BIN) ./cmd/ratchet
	@if command -v file >/dev/null 2>&1; then out="$$(file -b $(STATIC_BIN))"; \
	else out="$$(ldd $(STATIC_BIN) 2>&1 || true)"; fi; \
	case "$$out" in \
	*"statically linked"*|*"static-pie linked"*|*"not a dynamic executable"*) \
		echo "image-binary: $(STATIC_BIN) is statically linked";; \
	*) echo "image-binary: $(STATIC_BIN) is not statically linked: $$out" >&2; exit 1;; \
	esac

# musl-tools provides musl-gcc. Installed only as root with apt-get; anyone
# else gets the command to run.
musl-tools:
	@if command -v musl-gcc >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "image-binary: installing musl-tools (musl-gcc) with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends musl-tools || exit 1; \
	else \
		echo "image-binary: musl-gcc not found; install it with: sudo apt-get install -y musl-tools" >&2; \
		exit 1; \
	fi

## image: docker build of the Dockerfile into $(IMAGE) (needs a running Docker engine).
image:
	@command -v $(DOCKER) >/dev/null 2>&1 || { echo "image: the docker client is not installed" >&2; exit 1; }
	@$(DOCKER) info >/dev/null 2>&1 || { echo "image: no Docker engine answers ('$(DOCKER) info' failed); start one, or run 'make image-binary' for the static binary alone" >&2; exit 1; }
	$(DOCKER) build --build-arg VERSION=$(VERSION) -t $(IMAGE) .
