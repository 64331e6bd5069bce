#!/usr/bin/env bash
# check-proto.sh checks that the generated Go code committed under messages/
# is exactly what proto/ generates with the pinned tools, and fails on drift.
#
#   scripts/check-proto.sh          check (what `make proto-check` and CI run)
#   scripts/check-proto.sh --write  regenerate messages/ (what `make proto` runs)
#
# Pinned tools: protoc 3.21.12 (Debian package protobuf-compiler, with the
# well-known types from libprotobuf-dev) and protoc-gen-go v1.36.12. The
# generated header names both versions. With another protoc the check
# compares the files ignoring those version comment lines, so a newer local
# protoc does not fail the check spuriously; protoc-gen-go changes the code
# itself, so only the pinned version is used (installed into a temporary
# directory when the one on PATH or in $(go env GOPATH)/bin differs).
#
# When protoc is missing and cannot be installed (apt-get, as root only), the
# check prints why and exits 0, except with CI=true, where it exits 1: CI
# must never pass a check that did not run. --write always fails then.
#
# Environment:
#   MESSAGES_DIR   directory to compare with or write to (default: messages)
#   PROTOC         protoc binary to use (no install attempt when set)
#   PROTOC_GEN_GO  protoc-gen-go binary to use (must be v1.36.12)
#   CI             "true" makes an unavailable protoc a failure
#
# Exit status: 0 up to date (or skipped outside CI), 1 drift or error,
# 2 usage.
set -euo pipefail

readonly PROTOC_VERSION=3.21.12
readonly PROTOC_GEN_GO_VERSION=v1.36.12
readonly GO_MODULE=ratchet/messages # import path prefix of messages/
readonly PROTO_DIR=proto
readonly APT_PACKAGES="protobuf-compiler libprotobuf-dev"

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

mode="check"
case "${1:-}" in
"") ;;
--write) mode="write" ;;
-h | --help)
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
	exit 0
	;;
*)
	echo "usage: $0 [--write]" >&2
	exit 2
	;;
esac

messages_dir=${MESSAGES_DIR:-messages}

say() { echo "check-proto: $*" >&2; }
die() {
	say "error: $*"
	exit 1
}

# unavailable reports that the tools needed for the check are missing.
unavailable() {
	if [[ $mode == write ]]; then
		die "$1"
	fi
	if [[ ${CI:-} == true ]]; then
		say "error: $1"
		die "the proto drift check cannot run; with CI=true that is a failure, not a skip"
	fi
	say "warning: $1"
	say "warning: skipping the proto drift check (it is mandatory when CI=true)"
	exit 0
}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/check-proto.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# --- protoc ---------------------------------------------------------------

install_protoc() {
	if [[ $(id -u) != 0 ]]; then
		say "protoc not found; install it with: sudo apt-get install -y $APT_PACKAGES"
		return 1
	fi
	if ! command -v apt-get >/dev/null; then
		say "protoc not found and apt-get is not available; install protoc $PROTOC_VERSION"
		return 1
	fi
	say "protoc not found; running apt-get install -y $APT_PACKAGES"
	# shellcheck disable=SC2086 # word splitting of the package list is intended
	if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $APT_PACKAGES >&2; then
		DEBIAN_FRONTEND=noninteractive apt-get update >&2 || return 1
		# shellcheck disable=SC2086
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $APT_PACKAGES >&2 || return 1
	fi
	command -v protoc >/dev/null
}

if [[ -n ${PROTOC:-} ]]; then
	protoc=$PROTOC
	if ! [[ -x $protoc ]] && ! protoc=$(command -v "$PROTOC"); then
		unavailable "PROTOC=$PROTOC is not an executable"
	fi
elif protoc=$(command -v protoc); then
	:
elif install_protoc; then
	protoc=$(command -v protoc)
else
	unavailable "protoc is not installed and could not be installed"
fi

protoc_version=$("$protoc" --version 2>/dev/null | awk '{print $2}') ||
	unavailable "$protoc --version failed"
exact=true
if [[ $protoc_version != "$PROTOC_VERSION" ]]; then
	exact=false
	say "warning: protoc is $protoc_version, not the pinned $PROTOC_VERSION;" \
		"comparing without the version comment lines"
fi

# --- protoc-gen-go --------------------------------------------------------

gen_go_ok() { [[ -x $1 ]] && [[ $("$1" --version 2>/dev/null) == "protoc-gen-go $PROTOC_GEN_GO_VERSION" ]]; }

gen_go=""
if [[ -n ${PROTOC_GEN_GO:-} ]]; then
	gen_go_ok "$PROTOC_GEN_GO" || die "PROTOC_GEN_GO=$PROTOC_GEN_GO is not protoc-gen-go $PROTOC_GEN_GO_VERSION"
	gen_go=$PROTOC_GEN_GO
else
	for c in "$(go env GOPATH 2>/dev/null)/bin/protoc-gen-go" "$(command -v protoc-gen-go || true)"; do
		if [[ -n $c ]] && gen_go_ok "$c"; then
			gen_go=$c
			break
		fi
	done
	if [[ -z $gen_go ]]; then
		command -v go >/dev/null || unavailable "go is not installed, so protoc-gen-go $PROTOC_GEN_GO_VERSION cannot be built"
		say "building protoc-gen-go $PROTOC_GEN_GO_VERSION into a temporary directory"
		# Outside the module, so that nothing can touch go.mod or go.sum.
		(cd "$tmp" && GOBIN="$tmp/bin" go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO_VERSION") >&2 ||
			unavailable "go install protoc-gen-go@$PROTOC_GEN_GO_VERSION failed"
		gen_go=$tmp/bin/protoc-gen-go
	fi
fi

# --- generate -------------------------------------------------------------

mapfile -t protos < <(find "$PROTO_DIR" -name '*.proto' -type f | LC_ALL=C sort)
((${#protos[@]} > 0)) || die "no .proto files under $PROTO_DIR/"

# Each proto/<dir>/<name>.proto becomes package <dir without slashes> at
# import path ratchet/messages/<dir>: for proto/ratchet/v1/event.proto this is
# Mratchet/v1/event.proto=ratchet/messages/ratchet/v1;ratchetv1.
opts=(--go_opt="module=$GO_MODULE")
for f in "${protos[@]}"; do
	rel=${f#"$PROTO_DIR"/}
	dir=$(dirname "$rel")
	opts+=(--go_opt="M$rel=$GO_MODULE/$dir;${dir//\//}")
done

out=$tmp/out
mkdir -p "$out"
if ! "$protoc" -I "$PROTO_DIR" --plugin=protoc-gen-go="$gen_go" --go_out="$out" "${opts[@]}" "${protos[@]}" 2>"$tmp/protoc.err"; then
	cat "$tmp/protoc.err" >&2
	if grep -q 'google/protobuf/.*File not found' "$tmp/protoc.err"; then
		unavailable "protoc cannot find the well-known types (google/protobuf/*.proto); install libprotobuf-dev"
	fi
	die "protoc failed"
fi

# --- compare or write -----------------------------------------------------

# normalize prints a generated file, without the version comment lines of
# its header when the local protoc is not the pinned one.
normalize() {
	if $exact; then
		cat "$1"
	else
		sed -E '1,8{/^\/\/[[:space:]]+protoc(-gen-go)?[[:space:]]+(v[0-9].*|\(unknown\))$/d;}' "$1"
	fi
}

same() { cmp -s <(normalize "$1") <(normalize "$2"); }

mapfile -t generated < <(cd "$out" && find . -type f -name '*.pb.go' | sed 's|^\./||' | LC_ALL=C sort)
committed=()
if [[ -d $messages_dir ]]; then
	mapfile -t committed < <(cd "$messages_dir" && find . -type f -name '*.pb.go' | sed 's|^\./||' | LC_ALL=C sort)
fi
# Committed *.pb.go files that nothing generates any more (a removed .proto).
mapfile -t stale < <(comm -13 <(printf '%s\n' "${generated[@]}") <(printf '%s\n' "${committed[@]}") | sed '/^$/d')

if [[ $mode == write ]]; then
	changed=0
	for f in "${generated[@]}"; do
		if [[ -f $messages_dir/$f ]] && same "$out/$f" "$messages_dir/$f"; then
			continue # unchanged, or changed only in the version comments
		fi
		mkdir -p "$(dirname "$messages_dir/$f")"
		cp "$out/$f" "$messages_dir/$f"
		say "wrote $messages_dir/$f"
		changed=1
	done
	for f in "${stale[@]}"; do
		rm -f "$messages_dir/$f"
		say "removed $messages_dir/$f (no .proto generates it)"
		changed=1
	done
	((changed)) || say "$messages_dir/ is up to date"
	$exact || say "warning: generated with protoc $protoc_version; use protoc $PROTOC_VERSION for committed code"
	exit 0
fi

drift=0
for f in "${generated[@]}"; do
	if [[ ! -f $messages_dir/$f ]]; then
		say "missing: $messages_dir/$f"
		drift=1
	elif ! same "$out/$f" "$messages_dir/$f"; then
		say "differs: $messages_dir/$f"
		diff -u --label "$messages_dir/$f (committed)" --label "$messages_dir/$f (generated)" \
			<(normalize "$messages_dir/$f") <(normalize "$out/$f") | head -n 60 >&2 || true
		drift=1
	fi
done
for f in "${stale[@]}"; do
	say "stale: $messages_dir/$f (no .proto generates it)"
	drift=1
done

if ((drift)); then
	die "messages/ is out of date with proto/: run make proto"
fi
say "ok: $messages_dir/ matches $PROTO_DIR/ (protoc $protoc_version, protoc-gen-go $PROTOC_GEN_GO_VERSION)"
