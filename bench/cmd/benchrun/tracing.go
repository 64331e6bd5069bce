package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"ratchet/config"
	"ratchet/internal/produce"
	"ratchet/internal/tracing"
	"ratchet/processor/dashboard"
)

// tracedTopic holds the tracing section's backlog: records that carry a
// producer's traceparent, as `ratchet produce` writes them with tracing on,
// so a recorded batch span has its links to make.
const tracedTopic = "traced"

// tracingReport is the tracing section (i, issue 26): the same
// exactly-once drain of a backlog whose records carry a traceparent, with
// tracing off, on with every span sampled, and on with 1 % sampled, each
// exported with OTLP/HTTP to a receiver in this process that reads and
// drops the requests.
type tracingReport struct {
	events int64
	rounds []tracingRound
}

type tracingRound struct {
	off, all, one            drainResult
	bytesAll, bytesOne       int64 // OTLP bytes received during the drain
	requestsAll, requestsOne int64
}

// otlpSink is an OTLP/HTTP endpoint that reads every export request and
// answers success without decoding it (decoding would charge the
// receiver's work to the engine, which shares this process).
type otlpSink struct {
	srv      *http.Server
	addr     string
	bytes    atomic.Int64
	requests atomic.Int64
}

func startSink() (*otlpSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &otlpSink{addr: ln.Addr().String()}
	s.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		s.bytes.Add(n)
		s.requests.Add(1)
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK) // an empty ExportTraceServiceResponse
	})}
	go func() { _ = s.srv.Serve(ln) }() // ends when close shuts the server down
	return s, nil
}

func (s *otlpSink) close() { _ = s.srv.Close() }

// preloadTraced writes n events to tracedTopic, each under a sampled span
// of a provider that exports nothing: the records carry valid contexts.
func preloadTraced(ctx context.Context, brokers []string, n int64) error {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	st, err := produce.Run(ctx, produce.Options{Brokers: brokers, Topic: tracedTopic, Count: n, Seed: 5,
		Tracer: tracing.New(tp, tracing.Options{})}, slog.New(slog.DiscardHandler))
	if err != nil {
		return fmt.Errorf("preload %s: %w", tracedTopic, err)
	}
	if st.Produced != n {
		return fmt.Errorf("preload %s: %d of %d delivered", tracedTopic, st.Produced, n)
	}
	return nil
}

// runTracing preloads tracedTopic with n events and drains it once per
// setting in each of rounds rounds, the order rotating between rounds so
// that a drift of the machine's load favours no setting, and checks
// sum(count) after each drain. It sets the OTEL_* variables of this
// process, which the in-process engine reads.
func runTracing(ctx context.Context, env *benchEnv, n int64, rounds int, say func(string, ...any)) (*tracingReport, error) {
	if err := preloadTraced(ctx, env.brokers, n); err != nil {
		return nil, err
	}
	say("preloaded %d traced events to %s", n, tracedTopic)
	sink, err := startSink()
	if err != nil {
		return nil, err
	}
	defer sink.close()
	for k, v := range map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + sink.addr,
		"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
	} {
		if err := os.Setenv(k, v); err != nil {
			return nil, err
		}
	}
	rep := &tracingReport{events: n}
	drain := func(r int, setting string) (drainResult, int64, int64, error) {
		if _, err := env.db.pool.Exec(ctx, "TRUNCATE dashboard_rollups"); err != nil {
			return drainResult{}, 0, 0, err
		}
		on := setting != "off"
		sampler, arg := "always_on", ""
		if setting == "1%" {
			sampler, arg = "traceidratio", "0.01"
		}
		_ = os.Setenv("OTEL_TRACES_SAMPLER", sampler)
		_ = os.Setenv("OTEL_TRACES_SAMPLER_ARG", arg)
		b0, q0 := sink.bytes.Load(), sink.requests.Load()
		d, err := drainRatchet(ctx, env, tracedTopic, fmt.Sprintf("bench-i-%s-%d", strings.TrimSuffix(setting, "%"), r),
			config.ModeExactlyOnce, dashboard.New(), n, "", func(c *config.Config) { c.Tracing.Enabled = on })
		if err != nil {
			return drainResult{}, 0, 0, fmt.Errorf("round %d (i) tracing %s: %w", r, setting, err)
		}
		if got, err := rollupCount(ctx, env); err != nil || got != n {
			return drainResult{}, 0, 0, fmt.Errorf("round %d (i) tracing %s: sum(count) in dashboard_rollups is %d, want %d (%v)", r, setting, got, n, err)
		}
		bytes, reqs := sink.bytes.Load()-b0, sink.requests.Load()-q0
		say("round %d (i) exactly-once, tracing %-4s %9.0f events/s (wall %s), OTLP %d requests %.1f MiB, %s", r, setting+":",
			d.Rate(), d.Wall.Round(1e6), reqs, float64(bytes)/(1<<20), d.cpuLine())
		return d, bytes, reqs, nil
	}
	settings := []string{"off", "100%", "1%"}
	for r := 1; r <= rounds; r++ {
		var x tracingRound
		for i := range settings {
			setting := settings[(i+r-1)%len(settings)]
			d, bytes, reqs, err := drain(r, setting)
			if err != nil {
				return nil, err
			}
			switch setting {
			case "off":
				x.off = d
			case "100%":
				x.all, x.bytesAll, x.requestsAll = d, bytes, reqs
			default:
				x.one, x.bytesOne, x.requestsOne = d, bytes, reqs
			}
		}
		rep.rounds = append(rep.rounds, x)
	}
	return rep, nil
}

// rows adds the section's rows to the results table.
func (s *tracingReport) rows(row func(cells ...string)) {
	if s == nil || len(s.rounds) == 0 {
		return
	}
	series := func(f func(tracingRound) float64, format string) (string, float64) {
		var xs []float64
		var parts []string
		for _, r := range s.rounds {
			v := f(r)
			xs = append(xs, v)
			parts = append(parts, fmt.Sprintf(format, v))
		}
		return strings.Join(parts, ", "), median(xs)
	}
	rs, v := series(func(r tracingRound) float64 { return r.off.Rate() }, "%.0f")
	row(fmt.Sprintf("(i) exactly-once, dashboard, %d events with a traceparent, tracing off", s.events),
		fmt.Sprintf("%.0f events/s (rounds: %s)", v, rs), "", "")
	rs, v = series(func(r tracingRound) float64 { return r.all.Rate() }, "%.0f")
	row("(i) the same, tracing on, every span sampled (`OTEL_TRACES_SAMPLER=always_on`), OTLP/HTTP",
		fmt.Sprintf("%.0f events/s (rounds: %s)", v, rs), "", "")
	rs, v = series(func(r tracingRound) float64 { return r.one.Rate() }, "%.0f")
	row("(i) the same, tracing on, 1 % sampled (`traceidratio`, `0.01`)",
		fmt.Sprintf("%.0f events/s (rounds: %s)", v, rs), "", "")
	rs, v = series(func(r tracingRound) float64 { return r.all.Rate() / r.off.Rate() }, "%.2f")
	row("(i) tracing on at 100 % / off", fmt.Sprintf("%.2f (rounds: %s)", v, rs), "", "")
	rs, v = series(func(r tracingRound) float64 { return r.one.Rate() / r.off.Rate() }, "%.2f")
	row("(i) tracing on at 1 % / off", fmt.Sprintf("%.2f (rounds: %s)", v, rs), "≥ 0.95", passMiss(v >= 0.95))
	ra, va := series(func(r tracingRound) float64 { return float64(r.bytesAll) / (1 << 20) }, "%.1f")
	ro, vo := series(func(r tracingRound) float64 { return float64(r.bytesOne) / (1 << 20) }, "%.2f")
	row("(i) OTLP MiB exported per drain, 100 % / 1 %", fmt.Sprintf("%.1f / %.2f (rounds: %s / %s)", va, vo, ra, ro), "", "")
}

// method says how the section is measured.
func (s *tracingReport) method() string {
	if s == nil || len(s.rounds) == 0 {
		return ""
	}
	return fmt.Sprintf("- Tracing (i): %d rounds, each draining the same %d-event backlog (written by `internal/produce` with tracing on, so every record carries a `traceparent`) three times with the in-process engine at its defaults (exactly-once, dashboard) and a fresh group: `tracing.enabled` false; true with `OTEL_TRACES_SAMPLER=always_on`; true with `traceidratio` and `OTEL_TRACES_SAMPLER_ARG=0.01`; the order rotating between rounds. Spans go with OTLP/HTTP (the batch span processor at its defaults) to a receiver in the bench process that reads each request and drops it. `sum(count)` checked after each drain. Rate as in (c).\n",
		len(s.rounds), s.events)
}
