package produce

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"ratchet/internal/testenv"
	"ratchet/internal/tracing"
)

// traceparents reads topic from the start with franz-go until it has n
// records and returns each record's traceparent header ("" when none).
func traceparents(tb testing.TB, addr, topic string, n int) []string {
	tb.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		tb.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []string
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			tb.Fatalf("read %d of %d records within 20s", len(out), n)
		}
		fs.EachRecord(func(r *kgo.Record) {
			v := ""
			for _, h := range r.Headers {
				if h.Key == tracing.HeaderTraceparent {
					v = string(h.Value)
				}
			}
			out = append(out, v)
		})
	}
	return out
}

// TestRunCarriesTraceparentWhenTraced: with a Tracer every record is sent
// under a `send <topic>` producer span whose context it carries; without
// one no record has the header.
func TestRunCarriesTraceparentWhenTraced(t *testing.T) {
	const n = 50
	_, addr := testenv.Kafka(t, 2, "traced", "plain")
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	for _, topic := range []string{"traced", "plain"} {
		o := Options{Brokers: []string{addr}, Topic: topic, Count: n, Seed: 3, PoisonFraction: 0.1}
		if topic == "traced" {
			o.Tracer = tracing.New(tp, tracing.Options{})
		}
		if _, err := Run(t.Context(), o, quietLogger()); err != nil {
			t.Fatal(err)
		}
	}
	spans := map[trace.SpanID]bool{}
	for _, s := range rec.Ended() {
		if s.Name() == "send traced" && s.SpanKind() == trace.SpanKindProducer {
			spans[s.SpanContext().SpanID()] = true
		}
	}
	if len(spans) != n {
		t.Fatalf("%d send spans, want %d", len(spans), n)
	}
	for i, v := range traceparents(t, addr, "traced", n) {
		if len(v) != 55 {
			t.Fatalf("traced record %d has traceparent %q", i, v)
		}
		var id trace.SpanID
		copy(id[:], mustHex(t, v[36:52]))
		if !spans[id] {
			t.Errorf("traced record %d carries span %s, not one of the send spans", i, v[36:52])
		}
	}
	for i, v := range traceparents(t, addr, "plain", n) {
		if v != "" {
			t.Errorf("untraced record %d has traceparent %q", i, v)
		}
	}
}

func mustHex(tb testing.TB, s string) []byte {
	tb.Helper()
	id, err := trace.SpanIDFromHex(s)
	if err != nil {
		tb.Fatal(err)
	}
	return id[:]
}
