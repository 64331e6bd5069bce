# make bench: whole-pipeline figures against `ratchet broker` (a separate
# process) and the local PostgreSQL, compared side by side in one run.
# Results go to bench/results.md; logs and profiles to bench/out/.
# BENCH_EVENTS sizes the drain backlog, BENCH_MEM_LARGE the large memory
# backlog; BENCH_FLAGS passes anything else to bench/cmd/benchrun (e.g.
# -only-scale -scale-events 200000: the partition-count section alone;
# -only-exec-mode with BENCH_EVENTS=200000: the query exec mode section alone;
# -only-pipelines with BENCH_EVENTS=300000: the configured-pipelines section alone;
# -only-append -pipeline-orders 200000: the append section (j2) alone;
# -only-pg-rate (400000 orders per format; -pg-rate-records sets another): the section against PostgreSQL's own
#   rate (l) alone (upserts against a direct pgx loop, rollups against a Poll
#   loop), then again with PostgreSQL pinned to CPU 0 (-pg-rate-pin=false:
#   not); -pg-rate-tx 500,2000,5000 adds one direct upsert run at each of
#   those rows per transaction;
# -only-poison -pipeline-orders 100000: the poison section (j3) alone;
# -only-tracing with BENCH_EVENTS=200000: the tracing section alone;
# -only-kill-restart: the restart-after-kill -9 section alone).
GO              ?= go
BENCH_EVENTS    ?= 1000000
BENCH_MEM_LARGE ?= 2000000
BENCH_FLAGS     ?=

.PHONY: bench

## bench: throughput, latency, memory, commit load and restart cycles (~10 minutes); writes bench/results.md.
bench:
	$(GO) build -o bin/ratchet ./cmd/ratchet
	$(GO) build -o bin/benchrun ./bench/cmd/benchrun
	bin/benchrun -ratchet bin/ratchet -events $(BENCH_EVENTS) -mem-large $(BENCH_MEM_LARGE) \
		-out bench/results.md -out-dir bench/out \
		-command "make bench BENCH_EVENTS=$(BENCH_EVENTS) BENCH_MEM_LARGE=$(BENCH_MEM_LARGE) $(BENCH_FLAGS)" $(BENCH_FLAGS)
