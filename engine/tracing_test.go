package engine_test

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/event"
	"ratchet/internal/produce"
	"ratchet/internal/testenv"
	"ratchet/internal/tracing"
	"ratchet/internal/tracing/otlp"
)

// otlpReceiver is an OTLP/HTTP trace receiver: it decodes every export
// request and keeps the spans with their resource's service.name.
type otlpReceiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []receivedSpan
	bad   []string // requests it could not decode
}

type receivedSpan struct {
	service string
	span    *tracepb.Span
}

func startReceiver(tb testing.TB) *otlpReceiver {
	tb.Helper()
	r := &otlpReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/v1/traces" || req.Method != http.MethodPost {
			r.fail("unexpected " + req.Method + " " + req.URL.Path)
			http.NotFound(w, req)
			return
		}
		var body io.Reader = req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			z, err := gzip.NewReader(req.Body)
			if err != nil {
				r.fail(err.Error())
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = z
		}
		raw, err := io.ReadAll(body)
		var export coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(raw, &export)
		}
		if err != nil {
			r.fail(err.Error())
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		for _, rs := range export.ResourceSpans {
			service := ""
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					service = kv.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					r.spans = append(r.spans, receivedSpan{service: service, span: s})
				}
			}
		}
		r.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	tb.Cleanup(r.srv.Close)
	return r
}

func (r *otlpReceiver) fail(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.bad = append(r.bad, msg)
}

func (r *otlpReceiver) snapshot() ([]receivedSpan, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]receivedSpan(nil), r.spans...), append([]string(nil), r.bad...)
}

func intAttr(s *tracepb.Span, key string) int64 {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.GetValue().GetIntValue()
		}
	}
	return -1
}

func strAttr(s *tracepb.Span, key string) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

// TestTracesReachAnOTLPReceiver: `ratchet produce` and the engine, both
// with tracing on and pointed at an OTLP/HTTP receiver by the standard
// variables, export whole traces: every batch span links to the spans of
// the producer that wrote its records, its transactions and dead letters
// are its children, and every dead letter carries its send span's context.
func TestTracesReachAnOTLPReceiver(t *testing.T) {
	recv := startReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_TRACES_SAMPLER", "always_on")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	t.Setenv("OTEL_SERVICE_NAME", "")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "")

	const n = 400
	cluster, addr := testenv.Kafka(t, 2, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)

	// The producer, as `ratchet produce` runs it with tracing on.
	s, err := otlp.Read(os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	tp, err := otlp.New(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	st, err := produce.Run(t.Context(), produce.Options{Brokers: []string{addr}, Topic: topic, Count: n,
		PoisonFraction: 0.05, Format: event.FormatProtobuf, Seed: 11, Tracer: tracing.New(tp, tracing.Options{})},
		slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := tp.Shutdown(t.Context()); err != nil {
		t.Fatalf("flush the producer's spans: %v", err)
	}
	good := st.Produced - st.Poison
	if st.Poison == 0 || good == 0 {
		t.Fatalf("produced %+v: want good and poison records", st)
	}

	cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
	cfg.Tracing.Enabled = true
	r := start(t, cfg, ledger{"a"}, "a")
	waitApplied(t, pool, good)
	letters := readDLQ(t, cluster, addr, cfg.Kafka.DLQTopic(topic), int(st.Poison))
	r.Stop(t) // flushes the engine's spans by the stop's deadline

	var spans []receivedSpan
	testenv.Eventually(t, 30*time.Second, func() bool {
		spans, _ = recv.snapshot()
		var records int64
		for _, x := range spans {
			if x.span.Name == "process "+topic {
				records += intAttr(x.span, "messaging.batch.message_count")
			}
		}
		return records >= n
	}, "batch spans covering the %d records", n)
	if _, bad := recv.snapshot(); len(bad) > 0 {
		t.Fatalf("undecodable export requests: %v", bad)
	}

	producers := map[string]bool{} // span ids of the producer's send spans
	bySpan := map[string]*tracepb.Span{}
	for _, x := range spans {
		if x.service != "ratchet" {
			t.Fatalf("span %q from service %q, want ratchet", x.span.Name, x.service)
		}
		id := hex.EncodeToString(x.span.SpanId)
		bySpan[id] = x.span
		if x.span.Name == "send "+topic && x.span.Kind == tracepb.Span_SPAN_KIND_PRODUCER {
			producers[id] = true
		}
	}
	if len(producers) != n {
		t.Fatalf("%d producer spans, want %d", len(producers), n)
	}
	linked := map[string]bool{}
	var links, dropped int64
	dlqSends := map[string]bool{}
	for _, x := range spans {
		sp := x.span
		switch sp.Name {
		case "process " + topic:
			if sp.Kind != tracepb.Span_SPAN_KIND_CONSUMER {
				t.Errorf("batch span kind %v, want consumer", sp.Kind)
			}
			if strAttr(sp, "messaging.system") != "kafka" || strAttr(sp, "messaging.consumer.group.name") != cfg.Kafka.GroupID {
				t.Errorf("batch span attributes %v", sp.Attributes)
			}
			if u := intAttr(sp, tracing.AttrUnlinked); u != 0 {
				t.Errorf("batch span with %d records without a producer context, want 0", u)
			}
			links += intAttr(sp, tracing.AttrLinks)
			dropped += intAttr(sp, tracing.AttrLinksDropped)
			for _, l := range sp.Links {
				id := hex.EncodeToString(l.SpanId)
				if !producers[id] {
					t.Errorf("batch span links to %s, not a producer span", id)
				}
				linked[id] = true
			}
		case "transaction":
			parent := bySpan[hex.EncodeToString(sp.ParentSpanId)]
			if parent == nil || parent.Name != "process "+topic {
				t.Errorf("transaction span without its batch span as parent")
			}
		case "send " + cfg.Kafka.DLQTopic(topic):
			parent := bySpan[hex.EncodeToString(sp.ParentSpanId)]
			if parent == nil || parent.Name != "process "+topic {
				t.Errorf("dead-letter send span without its batch span as parent")
			}
			dlqSends[hex.EncodeToString(sp.SpanId)] = true
		}
	}
	if links+dropped < n {
		t.Errorf("links %d + dropped %d < %d records", links, dropped, n)
	}
	if int64(len(linked)) != links {
		t.Errorf("%d distinct producer spans linked, the batch spans count %d links", len(linked), links)
	}
	if len(dlqSends) < int(st.Poison) {
		t.Errorf("%d dead-letter send spans, want at least %d", len(dlqSends), st.Poison)
	}
	for _, l := range letters {
		tpHeader := l.headers[tracing.HeaderTraceparent]
		// 00-<trace id>-<span id>-<flags>
		if len(tpHeader) != 55 || !dlqSends[tpHeader[36:52]] {
			t.Errorf("dead letter at %d carries traceparent %q, not one of the dead-letter send spans", l.offset, tpHeader)
		}
	}
}

// TestRollingRestartLeavesSpans: an instance that joins, takes partitions
// from another and stops leaves the spans a slow rolling restart is read
// from: `claim` on every assignment, `revoke` on the instance giving
// partitions up, `stop` on each, and the commits of a revoke or a stop as
// their children.
func TestRollingRestartLeavesSpans(t *testing.T) {
	cluster, addr := testenv.Kafka(t, 4, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
	cfg.Tracing.Enabled = true
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	opts := func(owner string) engine.Options {
		return engine.Options{Processor: ledger{owner}, Owner: owner, TracerProvider: tp}
	}

	s := stream(t, addr, 20, 20*time.Millisecond)
	a := startWith(t, cfg, opts("a"), testenv.Log{})
	waitOwnerApplies(t, pool, "a")
	b := startWith(t, cfg, opts("b"), testenv.Log{}) // joins: a gives up partitions
	waitMembers(t, cluster, cfg.Kafka.GroupID, 2)
	waitOwnerApplies(t, pool, "b")
	a.Stop(t)
	s.stop()
	waitApplied(t, pool, s.sent.Load())
	b.Stop(t)

	spans := rec.Ended()
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	count := map[string]int{}
	for _, sp := range spans {
		byID[sp.SpanContext().SpanID()] = sp
		count[sp.Name()]++
	}
	if count["claim"] < 2 || count["revoke"] < 1 || count["stop"] != 2 {
		t.Fatalf("spans %v, want a claim per instance, a revoke and two stops", count)
	}
	underLifecycle := 0
	for _, sp := range spans {
		if sp.Name() != "commit" || !sp.Parent().IsValid() {
			continue
		}
		parent, ok := byID[sp.Parent().SpanID()]
		if !ok || (parent.Name() != "stop" && parent.Name() != "revoke") {
			t.Errorf("commit span under %v, want a stop or a revoke", sp.Parent().SpanID())
			continue
		}
		underLifecycle++
	}
	if underLifecycle == 0 {
		t.Error("no commit span under a stop or a revoke")
	}
}
