package tracing

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// recorded returns a Tracer whose spans end up in the returned recorder,
// every one sampled.
func recorded(tb testing.TB, o Options) (*Tracer, *tracetest.SpanRecorder) {
	tb.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	tb.Cleanup(func() { _ = tp.Shutdown(tb.Context()) })
	return New(tp, o), rec
}

// attrs indexes a span's attributes by key.
func attrs(s sdktrace.ReadOnlySpan) map[string]attribute.Value {
	m := map[string]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value
	}
	return m
}

// produced makes n records of topic at offsets from 0, each sent under its
// own span of t (a producer) when traced is true for its index; it returns
// the records and the producers' span contexts by offset.
func produced(t *Tracer, topic string, n int, traced func(i int) bool) ([]*kafka.Message, map[int64]trace.SpanContext) {
	msgs := make([]*kafka.Message, n)
	ctxs := map[int64]trace.SpanContext{}
	for i := range n {
		m := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Offset: kafka.Offset(i)}}
		m.Headers = []kafka.Header{{Key: "other", Value: []byte("x")}}
		if traced(i) {
			s := t.StartSend(Ref{}, topic, nil)
			m.Headers = s.Inject(m.Headers)
			ctxs[int64(i)] = s.span.SpanContext()
			s.End(nil)
		}
		msgs[i] = m
	}
	return msgs, ctxs
}

func TestBatchSpanLinksEveryRecordUpToTheCap(t *testing.T) {
	for _, tc := range []struct {
		name                               string
		n, max                             int
		traced                             func(int) bool
		wantLinks, wantDropped, wantNoCtxt int
	}{
		{"all traced, under the cap", 4, 10, func(int) bool { return true }, 4, 0, 0},
		{"all traced, over the cap", 10, 3, func(int) bool { return true }, 3, 7, 0},
		{"some traced, over the cap", 10, 3, func(i int) bool { return i%2 == 0 }, 3, 2, 5},
		{"none traced", 5, 3, func(int) bool { return false }, 0, 0, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, rec := recorded(t, Options{Group: "g1", MaxLinks: tc.max})
			msgs, ctxs := produced(tr, "events", tc.n, tc.traced)
			b := tr.StartBatch("events", 7, msgs)
			b.End(BatchApplied, nil)

			var batch sdktrace.ReadOnlySpan
			for _, s := range rec.Ended() {
				if s.Name() == "process events" {
					batch = s
				}
			}
			if batch == nil {
				t.Fatal("no process span")
			}
			if batch.SpanKind() != trace.SpanKindConsumer {
				t.Errorf("kind %v, want consumer", batch.SpanKind())
			}
			a := attrs(batch)
			for k, want := range map[string]string{
				"messaging.system":                   "kafka",
				"messaging.destination.name":         "events",
				"messaging.destination.partition.id": "7",
				"messaging.consumer.group.name":      "g1",
				"messaging.operation.type":           "process",
				AttrOutcome:                          BatchApplied,
			} {
				if got := a[k].AsString(); got != want {
					t.Errorf("%s = %q, want %q", k, got, want)
				}
			}
			for k, want := range map[string]int64{
				"messaging.batch.message_count": int64(tc.n),
				AttrFirstOffset:                 0,
				AttrLastOffset:                  int64(tc.n - 1),
				AttrLinks:                       int64(tc.wantLinks),
				AttrLinksMax:                    int64(tc.max),
				AttrLinksDropped:                int64(tc.wantDropped),
				AttrUnlinked:                    int64(tc.wantNoCtxt),
			} {
				if got := a[k].AsInt64(); got != want {
					t.Errorf("%s = %d, want %d", k, got, want)
				}
			}
			if got := a[AttrLinks].AsInt64() + a[AttrLinksDropped].AsInt64() + a[AttrUnlinked].AsInt64(); got != int64(tc.n) {
				t.Errorf("links + dropped + unlinked = %d, want the batch size %d", got, tc.n)
			}
			links := batch.Links()
			if len(links) != tc.wantLinks {
				t.Fatalf("%d links, want %d", len(links), tc.wantLinks)
			}
			// The links are the first traced records', in offset order.
			want := []trace.SpanContext{}
			for i := range tc.n {
				if sc, ok := ctxs[int64(i)]; ok && len(want) < tc.wantLinks {
					want = append(want, sc)
				}
			}
			for i, l := range links {
				if l.SpanContext.TraceID() != want[i].TraceID() || l.SpanContext.SpanID() != want[i].SpanID() {
					t.Errorf("link %d to %s/%s, want the producer's %s/%s", i, l.SpanContext.TraceID(), l.SpanContext.SpanID(),
						want[i].TraceID(), want[i].SpanID())
				}
			}
		})
	}
}

func TestBatchChildrenAndEvents(t *testing.T) {
	tr, rec := recorded(t, Options{Group: "g"})
	msgs, _ := produced(tr, "events", 4, func(int) bool { return false })
	b := tr.StartBatch("events", 0, msgs)
	tx := b.StartTx(0, 4, 4)
	tx.End(TxRolledBack, errors.New("data exception"))
	b.Bisect(0, 2, 4, errors.New("data exception"))
	b.Retry(1, "transient", errors.New("connection reset"))
	send := b.StartSend("events.dlq")
	headers := send.Inject([]kafka.Header{{Key: HeaderTraceparent, Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")}})
	send.End(nil)
	b.RecordFailed(3, errors.New("bad record"))
	b.End(BatchApplied, nil)

	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byName[s.Name()] = s
	}
	batch, txs, sent := byName["process events"], byName["transaction"], byName["send events.dlq"]
	if batch == nil || txs == nil || sent == nil {
		t.Fatalf("spans %v, want process, transaction and send", byName)
	}
	for _, child := range []sdktrace.ReadOnlySpan{txs, sent} {
		if child.Parent().SpanID() != batch.SpanContext().SpanID() || child.SpanContext().TraceID() != batch.SpanContext().TraceID() {
			t.Errorf("%s is not a child of the batch span", child.Name())
		}
	}
	if got := attrs(txs)[AttrOutcome].AsString(); got != TxRolledBack {
		t.Errorf("transaction outcome %q, want %q", got, TxRolledBack)
	}
	if txs.Status().Code != codes.Error {
		t.Errorf("rolled back transaction status %v, want error", txs.Status())
	}
	if sent.SpanKind() != trace.SpanKindProducer {
		t.Errorf("send kind %v, want producer", sent.SpanKind())
	}
	// The dead letter carries the send span's context, in place of the
	// original record's.
	n := 0
	for _, h := range headers {
		if h.Key == HeaderTraceparent {
			n++
		}
	}
	if sc := Extract(headers); n != 1 || sc.SpanID() != sent.SpanContext().SpanID() {
		t.Errorf("dead letter traceparent %v (%d headers), want the send span %s", sc.SpanID(), n, sent.SpanContext().SpanID())
	}
	var events []string
	for _, e := range batch.Events() {
		events = append(events, e.Name)
		if e.Name == "retry" {
			for _, kv := range e.Attributes {
				if kv.Key == "error.type" && kv.Value.AsString() != "transient" {
					t.Errorf("retry error.type %q, want transient", kv.Value.AsString())
				}
			}
		}
	}
	if want := []string{"bisect", "retry", "record failed"}; !equal(events, want) {
		t.Errorf("batch events %v, want %v", events, want)
	}
	if batch.Status().Code != codes.Error {
		t.Errorf("batch with a record error has status %v, want error", batch.Status())
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestOffCostsNothing: a nil Tracer allocates nothing, whatever is asked
// of it, and its spans write no headers.
func TestOffCostsNothing(t *testing.T) {
	var tr *Tracer
	topic := "events"
	msgs := []*kafka.Message{{TopicPartition: kafka.TopicPartition{Topic: &topic}, Headers: []kafka.Header{
		{Key: HeaderTraceparent, Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")}}}}
	err := errors.New("x")
	allocs := testing.AllocsPerRun(100, func() {
		b := tr.StartBatch(topic, 0, msgs)
		tx := b.StartTx(0, 1, 1)
		tx.End(TxCommitted, nil)
		b.Retry(1, "transient", err)
		b.Bisect(0, 1, 2, err)
		s := b.StartSend("events.dlq")
		if h := s.Inject(nil); h != nil {
			t.Fatal("headers written with tracing off")
		}
		s.End(nil)
		b.RecordFailed(0, err)
		_ = b.LogAttr()
		b.End(BatchApplied, nil)
		c := tr.StartCommit(b.Ref(), 1, nil)
		c.End(nil)
		sp := tr.Start("stop", Ref{})
		sp.Int("n", 1)
		sp.End(nil)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per batch with tracing off, want 0", allocs)
	}
}

func TestInjectReplacesAndExtractReads(t *testing.T) {
	tr, _ := recorded(t, Options{})
	s := tr.StartSend(Ref{}, "t", nil)
	defer s.End(nil)
	orig := []kafka.Header{{Key: "a", Value: []byte("1")}, {Key: HeaderTraceparent, Value: []byte("garbage")}, {Key: HeaderTracestate, Value: []byte("x=y")}}
	got := s.Inject(orig)
	if orig[1].Key != HeaderTraceparent || string(orig[1].Value) != "garbage" {
		t.Error("Inject modified the headers it was given")
	}
	if len(got) != 2 || got[0].Key != "a" || got[1].Key != HeaderTraceparent {
		t.Fatalf("headers %v, want a and one traceparent", got)
	}
	if sc := Extract(got); sc.SpanID() != s.span.SpanContext().SpanID() {
		t.Errorf("extracted %v, want %v", sc.SpanID(), s.span.SpanContext().SpanID())
	}
	if sc := Extract(orig[:2]); sc.IsValid() {
		t.Errorf("a garbage traceparent extracted as %v", sc)
	}
	if sc := Extract(nil); sc.IsValid() {
		t.Error("no headers extracted as a valid context")
	}
}

// TestSendLinksToTheDeadLetter: a replayed record's send span links to
// the context its dead letter carries.
func TestSendLinksToTheDeadLetter(t *testing.T) {
	tr, rec := recorded(t, Options{})
	dl := tr.StartSend(Ref{}, "events.dlq", nil)
	letter := dl.Inject(nil)
	dl.End(nil)
	replay := tr.StartSend(Ref{}, "events", letter)
	replay.End(nil)
	var got sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "send events" {
			got = s
		}
	}
	if got == nil || len(got.Links()) != 1 || got.Links()[0].SpanContext.SpanID() != dl.span.SpanContext().SpanID() {
		t.Fatalf("replay span %v does not link to the dead letter's send span", got)
	}
}

// TestLogAttrNamesTheTrace: a log line about a batch written after its
// span ended (the partition logs the outcome) still names the trace; a
// batch not sampled, or tracing off, adds nothing to the line.
func TestLogAttrNamesTheTrace(t *testing.T) {
	tr, _ := recorded(t, Options{})
	topic := "events"
	msgs := []*kafka.Message{{TopicPartition: kafka.TopicPartition{Topic: &topic}}}
	b := tr.StartBatch(topic, 0, msgs)
	b.End(BatchApplied, nil)
	if a := b.LogAttr(); a.Key != "trace_id" || a.Value.String() != b.Ref().TraceID() || len(a.Value.String()) != 32 {
		t.Errorf("LogAttr after End = %v, want trace_id=%s", a, b.Ref().TraceID())
	}
	never := New(sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())), Options{})
	if a := never.StartBatch(topic, 0, msgs).LogAttr(); !a.Equal(slog.Attr{}) {
		t.Errorf("LogAttr of a batch not sampled = %v, want the empty attribute", a)
	}
	var off *Tracer
	if a := off.StartBatch(topic, 0, msgs).LogAttr(); !a.Equal(slog.Attr{}) {
		t.Errorf("LogAttr with tracing off = %v, want the empty attribute", a)
	}
}

// BenchmarkBatch is what tracing adds to one batch of 500 records that all
// carry a traceparent, as the engine calls it: the batch span, one
// transaction span, the log attribute, the end; off, at 1 % and at 100 %
// sampling (spans dropped by a processor that keeps nothing, so the
// export is not measured here: bench/cmd/benchrun section (i) measures
// the whole pipeline with OTLP export).
func BenchmarkBatch(b *testing.B) {
	producer, _ := recorded(b, Options{})
	topic := "events"
	msgs, _ := produced(producer, topic, 500, func(int) bool { return true })
	for _, tc := range []struct {
		name    string
		sampler sdktrace.Sampler
	}{{"off", nil}, {"1%", sdktrace.TraceIDRatioBased(0.01)}, {"100%", sdktrace.AlwaysSample()}} {
		b.Run(tc.name, func(b *testing.B) {
			var tr *Tracer
			if tc.sampler != nil {
				tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(tc.sampler))
				b.Cleanup(func() { _ = tp.Shutdown(b.Context()) })
				tr = New(tp, Options{Group: "g"})
			}
			b.ReportAllocs()
			for b.Loop() {
				batch := tr.StartBatch(topic, 3, msgs)
				tx := batch.StartTx(0, 500, 500)
				tx.End(TxCommitted, nil)
				_ = batch.LogAttr()
				batch.End(BatchApplied, nil)
			}
		})
	}
}

// TestParseTraceparentAgreesWithThePropagator: the allocation-free parser
// the batch span's links use reads what the W3C propagator reads.
func TestParseTraceparentAgreesWithThePropagator(t *testing.T) {
	for _, v := range []string{
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
		"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-future",
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
		"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"00-00000000000000000000000000000000-b7ad6b7169203331-01",
		"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
		"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
		"00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"",
		"garbage",
	} {
		headers := []kafka.Header{{Key: HeaderTraceparent, Value: []byte(v)}}
		want, got := Extract(headers), linkContext(headers)
		if want.TraceID() != got.TraceID() || want.SpanID() != got.SpanID() || want.IsValid() != got.IsValid() ||
			want.IsSampled() != got.IsSampled() {
			t.Errorf("%q: parsed %v, the propagator reads %v", v, got, want)
		}
	}
}
