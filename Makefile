# ratchet — the two commands a newcomer needs are `make run` and `make test`.
SHELL := /bin/bash
GO    ?= go
BIN   ?= bin/ratchet
PKGS  := ./...

.PHONY: run test vet build clean soak fuzz chaos

## run: start PostgreSQL if needed, build bin/ratchet, then `ratchet dev` (broker, demo producer, engine,
## page). Ctrl-C stops it cleanly, with no error from make: ratchet is exec'd in place of the recipe's
## shell, so make sees its exit status (0 on a clean stop), not `go run`'s (1 whenever its child was
## signalled). make itself then ends by the same SIGINT, as anything stopped with Ctrl-C does (status 130).
run:
	@bash scripts/dev-postgres.sh
	$(GO) build -o $(BIN) ./cmd/ratchet
	exec $(BIN) dev

## test: vet, the proto drift check, every test (integration included) with the race detector, a short fuzz pass.
test: vet proto-check
	$(GO) test -race -count=1 -timeout 45m $(PKGS)
	FUZZTIME=$(FUZZTIME) bash scripts/fuzz-short.sh

FUZZTIME ?= 10000x

## fuzz: every fuzz target for FUZZTIME (default 10000x executions in make test; try FUZZTIME=5m).
fuzz:
	FUZZTIME=$(FUZZTIME) bash scripts/fuzz-short.sh

vet:
	$(GO) vet $(PKGS)

## build: the ratchet binary in bin/.
build:
	$(GO) build -o $(BIN) ./cmd/ratchet

clean:
	rm -rf bin

include proto.mk
include mk/image.mk
include mk/bench.mk

## chaos: the seeded chaos explorer: CHAOS_SEEDS schedules of overlapping faults (default 20, from
## CHAOS_FIRST_SEED, default 1) of CHAOS_DURATION each (default 90s); CHAOS_SEED=N replays one schedule.
CHAOS_SEEDS    ?= 20
CHAOS_DURATION ?= 90s
chaos:
	CHAOS_SEEDS=$(CHAOS_SEEDS) CHAOS_DURATION=$(CHAOS_DURATION) $(GO) test -count=1 -timeout 0 -run TestExplore -v ./test/chaos/

## soak: 10 minutes under load with a chaos event every 30 s (RATCHET_SOAK_DURATION to change), then the
## membership churn and rolling restart tests five times each with 60 membership changes a run, then
## 20 more chaos explorer seeds (101–120) of 90 s.
soak:
	RATCHET_SOAK=1 $(GO) test -count=1 -timeout 40m -run TestSoak -v ./test/faults/
	RATCHET_CHURN_EVENTS=60 $(GO) test -race -count=5 -timeout 90m -run 'TestChurnWithOverlapReplaysNothing|TestRollingRestartOfStaticMembers' ./engine/
	CHAOS_SEEDS=20 CHAOS_FIRST_SEED=101 CHAOS_DURATION=90s $(GO) test -count=1 -timeout 0 -run TestExplore -v ./test/chaos/
