package actors

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"ratchet/internal/metrics"
	"ratchet/internal/store"
	"ratchet/internal/testenv"
	"ratchet/internal/tracing"
	ratchetv1 "ratchet/messages/ratchet/v1"
	"ratchet/processor"
)

// spanTracer returns a Tracer recording every span in the returned
// recorder.
func spanTracer(tb testing.TB, maxLinks int) (*tracing.Tracer, *tracetest.SpanRecorder) {
	tb.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	tb.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tracing.New(tp, tracing.Options{Group: "g", MaxLinks: maxLinks}), rec
}

// awaitSpan waits until a span called name with the attribute outcome
// ended, and returns every span ended by then.
func awaitSpan(tb testing.TB, rec *tracetest.SpanRecorder, name, outcome string) []sdktrace.ReadOnlySpan {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		spans := rec.Ended()
		for _, s := range spans {
			if s.Name() == name && spanAttr(s, tracing.AttrOutcome).AsString() == outcome {
				return spans
			}
		}
		if time.Now().After(deadline) {
			names := []string{}
			for _, s := range spans {
				names = append(names, s.Name()+"/"+spanAttr(s, tracing.AttrOutcome).AsString())
			}
			tb.Fatalf("no %s span with outcome %s within 10s; ended: %v", name, outcome, names)
		}
		time.Sleep(5 * time.Millisecond) // polling the recorder for a condition, with a deadline
	}
}

func spanAttr(s sdktrace.ReadOnlySpan, key string) attribute.Value {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func named(spans []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// tracedRecords makes records of events[0] at [from, to), each produced
// under a span of producer, poison at the offsets in poison; it returns
// them and the producers' span contexts in offset order.
func tracedRecords(tb testing.TB, producer *tracing.Tracer, from, to int64, poison ...int64) ([]*kafka.Message, []trace.SpanContext) {
	tb.Helper()
	good, err := proto.Marshal(&ratchetv1.Event{Metric: "m", Time: timestamppb.Now()})
	if err != nil {
		tb.Fatal(err)
	}
	topic := "events"
	var msgs []*kafka.Message
	var ctxs []trace.SpanContext
	for off := from; off < to; off++ {
		v := good
		if slices.Contains(poison, off) {
			v = []byte{0xff, 0xff, 0xff}
		}
		s := producer.StartSend(tracing.Ref{}, topic, nil)
		headers := s.Inject(nil)
		s.End(nil)
		ctxs = append(ctxs, tracing.Extract(headers))
		msgs = append(msgs, &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Offset: kafka.Offset(off)},
			Value: v, Headers: headers})
	}
	return msgs, ctxs
}

// headerDLQ keeps the headers the DLQ actor would give each dead letter's
// trace context, by offset.
type headerDLQ struct {
	mu      sync.Mutex
	headers map[int64][]kafka.Header
}

func (d *headerDLQ) DeadLetter(_ context.Context, letters []Letter) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, l := range letters {
		d.headers[l.Record.Offset] = l.Trace.Inject(nil)
	}
	return nil
}

// TestBatchSpanFollowsRetriesBisectionAndDeadLetters: one batch with a
// record that does not decode and one the processor refuses is one
// `process events` span, linked to its records' producers up to the cap,
// whose children are its transactions (refused whole, then bisected) and
// the `send events.dlq` span of each dead letter; each dead letter carries
// its send span's context.
func TestBatchSpanFollowsRetriesBisectionAndDeadLetters(t *testing.T) {
	tr, rec := spanTracer(t, 3)
	app := &scriptedApplier{bad: map[int64]bool{4: true}}
	dlq := &headerDLQ{headers: map[int64][]kafka.Header{}}
	h := startPartitionWith(t, app, dlq, 6, func(c *PartitionConfig) { c.Tracer = tr })
	msgs, producers := tracedRecords(t, tr, 0, 6, 1)
	h.held.Add(len(msgs), messagesBytes(msgs))
	h.sys.Root.Send(h.pid, &Records{Msgs: msgs})

	spans := awaitSpan(t, rec, "process events", tracing.BatchApplied)
	batches := named(spans, "process events")
	if len(batches) != 1 {
		t.Fatalf("%d process spans, want 1", len(batches))
	}
	b := batches[0]
	for key, want := range map[string]int64{
		"messaging.batch.message_count": 6, tracing.AttrFirstOffset: 0, tracing.AttrLastOffset: 5,
		tracing.AttrLinks: 3, tracing.AttrLinksDropped: 3, tracing.AttrUnlinked: 0,
	} {
		if got := spanAttr(b, key).AsInt64(); got != want {
			t.Errorf("%s = %d, want %d", key, got, want)
		}
	}
	if got := spanAttr(b, "messaging.consumer.group.name").AsString(); got != "g" {
		t.Errorf("consumer group %q, want g", got)
	}
	for i, l := range b.Links() {
		if l.SpanContext.SpanID() != producers[i].SpanID() {
			t.Errorf("link %d to %s, want the producer of offset %d (%s)", i, l.SpanContext.SpanID(), i, producers[i].SpanID())
		}
	}
	if b.Status().Code != codes.Error || strings.Contains(b.Status().Description, "jane@") {
		t.Errorf("batch with poison has status %v, want error without the record's value", b.Status())
	}
	childOf := func(s sdktrace.ReadOnlySpan) bool {
		return s.Parent().SpanID() == b.SpanContext().SpanID() && s.SpanContext().TraceID() == b.SpanContext().TraceID()
	}

	// The dead letters: one send span each, children of the batch, whose
	// context the dead letter carries.
	sends := named(spans, "send events.dlq")
	if len(sends) != 2 {
		t.Fatalf("%d dead-letter send spans, want 2 (offsets 1 and 4)", len(sends))
	}
	dlq.mu.Lock()
	carried := map[int64]trace.SpanID{}
	for off, hs := range dlq.headers {
		carried[off] = tracing.Extract(hs).SpanID()
	}
	dlq.mu.Unlock()
	for _, s := range sends {
		if !childOf(s) || s.SpanKind() != trace.SpanKindProducer {
			t.Errorf("send span %s: kind %v, parent %s; want a producer span, child of the batch", s.SpanContext().SpanID(), s.SpanKind(), s.Parent().SpanID())
		}
		off := spanAttr(s, "ratchet.dead_letter.offset").AsInt64()
		// Without log.include_values the record's value stays out of the
		// traces, as out of the log.
		if got := spanAttr(s, "ratchet.dead_letter.reason").AsString(); off == 4 && got != `bad record: "…" is not a customer` {
			t.Errorf("send span reason %q, want the value left out", got)
		}
		if carried[off] != s.SpanContext().SpanID() {
			t.Errorf("dead letter at %d carries span %s, want its send span %s", off, carried[off], s.SpanContext().SpanID())
		}
	}

	// The transactions: the whole batch rolled back, then the bisected
	// halves, the last ones committed; a bisect event on the batch.
	txs := named(spans, "transaction")
	if len(txs) < 3 {
		t.Fatalf("%d transaction spans, want the refused batch and its halves", len(txs))
	}
	for _, x := range txs {
		if !childOf(x) {
			t.Errorf("transaction span %s is not a child of the batch", x.SpanContext().SpanID())
		}
	}
	if got := spanAttr(txs[0], tracing.AttrOutcome).AsString(); got != tracing.TxRolledBack {
		t.Errorf("first transaction %q, want %q", got, tracing.TxRolledBack)
	}
	if got := spanAttr(txs[len(txs)-1], tracing.AttrOutcome).AsString(); got != tracing.TxCommitted {
		t.Errorf("last transaction %q, want %q", got, tracing.TxCommitted)
	}
	bisects := 0
	for _, e := range b.Events() {
		if e.Name == "bisect" {
			bisects++
		}
	}
	if bisects == 0 {
		t.Error("no bisect event on the batch span")
	}
}

// transientOnce fails its first transaction with a serialization failure.
type transientOnce struct {
	mu    sync.Mutex
	calls int
}

func (a *transientOnce) ApplyWith(context.Context, processor.Batch, *store.Claim, store.ApplyOptions) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls++
	if a.calls == 1 {
		return &pgconn.PgError{Code: "40001", Message: "could not serialize access"}
	}
	return nil
}

// TestRetryIsAnEventWithItsClass: a transient failure is a `retry` event
// of class transient on the batch, between a rolled-back and a committed
// transaction.
func TestRetryIsAnEventWithItsClass(t *testing.T) {
	tr, rec := spanTracer(t, 0)
	h := startPartitionWith(t, &transientOnce{}, &headerDLQ{headers: map[int64][]kafka.Header{}}, 2,
		func(c *PartitionConfig) { c.Tracer = tr })
	msgs, _ := tracedRecords(t, tr, 0, 2)
	h.held.Add(len(msgs), messagesBytes(msgs))
	h.sys.Root.Send(h.pid, &Records{Msgs: msgs})

	spans := awaitSpan(t, rec, "process events", tracing.BatchApplied)
	b := named(spans, "process events")[0]
	var classes []string
	for _, e := range b.Events() {
		if e.Name != "retry" {
			continue
		}
		for _, kv := range e.Attributes {
			if kv.Key == "error.type" {
				classes = append(classes, kv.Value.AsString())
			}
		}
	}
	if !slices.Equal(classes, []string{"transient"}) {
		t.Errorf("retry events of classes %v, want [transient]", classes)
	}
	var outcomes []string
	for _, x := range named(spans, "transaction") {
		outcomes = append(outcomes, spanAttr(x, tracing.AttrOutcome).AsString())
	}
	if !slices.Equal(outcomes, []string{tracing.TxRolledBack, tracing.TxCommitted}) {
		t.Errorf("transactions %v, want rolled_back then committed", outcomes)
	}
}

// fencedApplier refuses every batch: another instance claimed the
// partition.
type fencedApplier struct{}

func (fencedApplier) ApplyWith(_ context.Context, b processor.Batch, c *store.Claim, _ store.ApplyOptions) error {
	return &store.OffsetConflictError{Kind: store.Fenced, Group: c.Group, Topic: b.Topic, Partition: b.Partition,
		Epoch: c.Epoch, StoredEpoch: c.Epoch + 1, Start: b.Start, StoredNext: b.Start}
}

// TestFencedBatchSetsTheStatus: a batch refused by the offset guard ends
// fenced with an error status, its transaction refused, and the log line
// about it names its trace.
func TestFencedBatchSetsTheStatus(t *testing.T) {
	tr, rec := spanTracer(t, 0)
	logs := &testenv.Buffer{}
	h := startPartitionWith(t, fencedApplier{}, &headerDLQ{headers: map[int64][]kafka.Header{}}, 2,
		func(c *PartitionConfig) { c.Tracer, c.Logger = tr, slog.New(slog.NewTextHandler(logs, nil)) })
	msgs, _ := tracedRecords(t, tr, 0, 2)
	h.held.Add(len(msgs), messagesBytes(msgs))
	h.sys.Root.Send(h.pid, &Records{Msgs: msgs})

	spans := awaitSpan(t, rec, "process events", tracing.BatchFenced)
	b := named(spans, "process events")[0]
	if b.Status().Code != codes.Error {
		t.Errorf("fenced batch status %v, want error", b.Status())
	}
	txs := named(spans, "transaction")
	if len(txs) != 1 || spanAttr(txs[0], tracing.AttrOutcome).AsString() != tracing.TxRefused {
		t.Errorf("transactions %d, want one refused", len(txs))
	}
	want := "trace_id=" + b.SpanContext().TraceID().String()
	testenv.Eventually(t, 10*time.Second, func() bool {
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "batch refused by the offset guard") && strings.Contains(line, want) {
				return true
			}
		}
		return false
	}, "the refusal logged with %s; log: %s", want, logs)
}

// TestCommitSpanLinksTheBatches: a flush under a stop's span commits
// under a child span that links to the batch that moved the watermark.
func TestCommitSpanLinksTheBatches(t *testing.T) {
	tr, rec := spanTracer(t, 0)
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
	fk := &fakeKafka{fail: map[int32]error{}}
	pid := sys.Root.Spawn(actor.PropsFromProducer(NewCommitter(CommitterConfig{
		Kafka: func() OffsetCommitter { return fk }, Interval: time.Hour, Metrics: metrics.New(prometheus.NewRegistry()),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Tracer: tr,
	})))
	t.Cleanup(func() { _ = sys.Root.StopFuture(pid).Wait() })

	tp := TopicPartition{Topic: "events", Partition: 0}
	msgs, _ := tracedRecords(t, tr, 0, 1)
	batch := tr.StartBatch("events", 0, msgs)
	batch.End(tracing.BatchApplied, nil)
	stop := tr.Start("stop", tracing.Ref{})
	sys.Root.Send(pid, &Register{TP: tp, Gen: 1, Start: 0, Committed: -1})
	sys.Root.Send(pid, &OffsetApplied{TP: tp, Gen: 1, Next: 1, Batch: batch.Ref()})
	if f := flush(t, sys, pid, &Flush{TPs: []TopicPartition{tp}, Trace: stop.Ref()}); f.Err != nil {
		t.Fatal(f.Err)
	}
	stop.End(nil)

	commits := named(rec.Ended(), "commit")
	if len(commits) != 1 {
		t.Fatalf("%d commit spans, want 1", len(commits))
	}
	c := commits[0]
	if c.Parent().SpanID() != stop.Ref().SpanContext().SpanID() {
		t.Errorf("commit span's parent %s, want the stop span", c.Parent().SpanID())
	}
	if len(c.Links()) != 1 || c.Links()[0].SpanContext.SpanID() != batch.Ref().SpanContext().SpanID() {
		t.Errorf("commit span links %v, want the batch span", c.Links())
	}
	if c.Status().Code == codes.Error {
		t.Errorf("commit span status %v, want ok", c.Status())
	}
}
