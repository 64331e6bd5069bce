# proto.mk: generation of the Go code in messages/ from proto/. Included by
# the main Makefile.
#
#   make proto        regenerate messages/ (installs the pinned tools first)
#   make proto-check  fail when messages/ is not what proto/ generates (CI)
#
# The generation itself lives in scripts/check-proto.sh, so that `make proto`
# and the drift check cannot disagree on flags. For proto/ratchet/v1/event.proto
# it runs:
#   protoc -I proto --go_out=messages --go_opt=module=ratchet/messages \
#     --go_opt='Mratchet/v1/event.proto=ratchet/messages/ratchet/v1;ratchetv1' \
#     proto/ratchet/v1/event.proto
# with protoc 3.21.12 (Debian protobuf-compiler; the well-known types such as
# google/protobuf/timestamp.proto come with libprotobuf-dev) and
# protoc-gen-go v1.36.12.

PROTOC_GEN_GO_VERSION := v1.36.12
PROTO_APT_PACKAGES    := protobuf-compiler libprotobuf-dev
# Recursive on purpose: `go env` runs only when a proto target does.
PROTO_GOBIN           = $(firstword $(subst :, ,$(shell go env GOPATH)))/bin
PROTO_GEN_GO          = $(PROTO_GOBIN)/protoc-gen-go

.PHONY: proto proto-check proto-tools

proto: proto-tools
	PROTOC_GEN_GO='$(PROTO_GEN_GO)' scripts/check-proto.sh --write

proto-check:
	scripts/check-proto.sh

# proto-tools installs protoc-gen-go $(PROTOC_GEN_GO_VERSION) into
# $(go env GOPATH)/bin when it is missing or another version, and protoc with
# apt-get when it is missing (as root; otherwise it prints the command).
proto-tools:
	@if [ "$$('$(PROTO_GEN_GO)' --version 2>/dev/null)" != "protoc-gen-go $(PROTOC_GEN_GO_VERSION)" ]; then \
		echo "installing protoc-gen-go $(PROTOC_GEN_GO_VERSION) into $(PROTO_GOBIN)"; \
		GOBIN='$(PROTO_GOBIN)' go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION) || exit 1; \
	fi
	@if ! command -v protoc >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing protoc: apt-get install -y $(PROTO_APT_PACKAGES)"; \
			DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(PROTO_APT_PACKAGES) || \
			{ DEBIAN_FRONTEND=noninteractive apt-get update && \
			  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(PROTO_APT_PACKAGES); } || exit 1; \
		else \
			echo "protoc is not installed; install it with:" >&2; \
			echo "  sudo apt-get install -y $(PROTO_APT_PACKAGES)" >&2; \
			exit 1; \
		fi; \
	fi
