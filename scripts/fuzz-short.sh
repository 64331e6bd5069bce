#!/usr/bin/env bash
# fuzz-short.sh runs every Go fuzz target in the repository for a short
# while each, and fails when any of them fails. It is the fuzz pass of
# `make test` and CI; the seed corpora (testdata/fuzz) run with every plain
# `go test` already.
#
#   scripts/fuzz-short.sh                every target, FUZZTIME each (default 10000x)
#   FUZZTIME=200000x scripts/fuzz-short.sh
#   FUZZTIME=5m scripts/fuzz-short.sh    a long local run
#
# The default budget is a count of executions, not a duration: with a
# duration, Go's fuzz coordinator (up to Go 1.26) can report a bare
# "context deadline exceeded" failure at the moment the time runs out, with
# no failing input (go.dev/issue/75804); a loaded CI machine hits it. A count
# has no deadline to race. For duration budgets that exact flake (that error,
# no failing input written) is reported and tolerated; every other failure
# fails the run.
#
# Targets are found with grep: every `func FuzzXxx(` in a *_test.go file.
# A failing input is written by `go test` under the package's
# testdata/fuzz/FuzzXxx/; commit it with the fix so it stays a regression
# test.
#
# Environment:
#   FUZZTIME   -fuzztime of each target: Nx or a duration (default 10000x)
#   GO         go binary (default go)
#
# Exit status: 0 all passed, 1 a target failed or none were found.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

fuzztime=${FUZZTIME:-10000x}
go=${GO:-go}

# "dir name" per target, sorted for a stable order.
mapfile -t targets < <(
	grep -rE --include='*_test.go' -o '^func Fuzz[A-Za-z0-9_]+\(' . |
		sed -E 's#^\./(.*)/[^/]+_test\.go:func (Fuzz[A-Za-z0-9_]+)\($#\1 \2#; s#^\./[^/]+_test\.go:func (Fuzz[A-Za-z0-9_]+)\($#. \1#' |
		grep -v '^\./\|/vendor/\|^vendor/' |
		sort -u
)
if [[ ${#targets[@]} -eq 0 ]]; then
	echo "fuzz-short: no fuzz targets found" >&2
	exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT

failed=()
for t in "${targets[@]}"; do
	dir=${t% *}
	name=${t#* }
	echo "fuzz-short: ./$dir $name for $fuzztime"
	if "$go" test -run='^$' -fuzz="^${name}\$" -fuzztime="$fuzztime" "./$dir" 2>&1 | tee "$log"; then
		continue
	fi
	if [[ $fuzztime != *x ]] && grep -q 'context deadline exceeded' "$log" &&
		! grep -qE 'Failing input written|panic:' "$log"; then
		echo "fuzz-short: ./$dir $name: the fuzz coordinator's deadline race (go.dev/issue/75804), no failing input; not a finding"
		continue
	fi
	failed+=("./$dir $name")
done

if [[ ${#failed[@]} -gt 0 ]]; then
	echo "fuzz-short: failed:" >&2
	printf '  %s\n' "${failed[@]}" >&2
	exit 1
fi
echo "fuzz-short: ${#targets[@]} targets passed"
