# ratchet — the two commands a newcomer needs are `make run` and `make test`.
SHELL := /bin/bash
GO    ?= go
BIN   ?= bin/ratchet
PKGS  := ./...

.PHONY: run test vet build clean soak fuzz

## run: start PostgreSQL if needed, then `ratchet dev` (broker, demo producer, engine, page).
run:
	@bash scripts/dev-postgres.sh
	$(GO) run ./cmd/ratchet dev

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

## soak: 10 minutes under load with a chaos event every 30 s (RATCHET_SOAK_DURATION to change), then the
## membership churn and rolling restart tests five times each with 60 membership changes a run.
soak:
	RATCHET_SOAK=1 $(GO) test -count=1 -timeout 40m -run TestSoak -v ./test/faults/
	RATCHET_CHURN_EVENTS=60 $(GO) test -race -count=5 -timeout 90m -run 'TestChurnWithOverlapReplaysNothing|TestRollingRestartOfStaticMembers' ./engine/
