package tracing

import (
	"context"
	"log/slog"
	"strconv"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"ratchet/processor"
)

// InstrumentationName names ratchet's tracer (the instrumentation scope of
// every span it makes).
const InstrumentationName = "ratchet"

// DefaultMaxLinks is how many records of one batch link their producer's
// context when Options.MaxLinks is not set: the OpenTelemetry SDK's default
// link limit per span (OTEL_SPAN_LINK_COUNT_LIMIT), so the SDK drops none
// of them by itself.
const DefaultMaxLinks = 128

// Attributes of ratchet's own, beside the semantic conventions'.
const (
	AttrFirstOffset  = "ratchet.batch.first_offset"
	AttrLastOffset   = "ratchet.batch.last_offset"
	AttrLinks        = "ratchet.batch.links"         // records linked
	AttrLinksMax     = "ratchet.batch.links.max"     // the cap per batch
	AttrLinksDropped = "ratchet.batch.links.dropped" // records with a context, not linked because of the cap
	AttrUnlinked     = "ratchet.batch.unlinked"      // records with no traceparent (or an invalid one)
	AttrOutcome      = "ratchet.outcome"
	AttrAttempt      = "ratchet.attempt"
)

// Outcomes of a batch span (AttrOutcome).
const (
	BatchApplied   = "applied"   // its range is applied (its poison dead-lettered)
	BatchFenced    = "fenced"    // refused by the offset guard: another instance claimed the partition, or the batch did not start where the store says
	BatchPanicked  = "panicked"  // the processor panicked; the partition restarts or isolates it
	BatchAbandoned = "abandoned" // neither applied nor dead-lettered; the partition reads its range again
	BatchDropped   = "dropped"   // cut ahead and never sent: the partition stopped, restarted or rewound
)

// Outcomes of a transaction span (AttrOutcome).
const (
	TxCommitted     = "committed"
	TxRefused       = "refused"        // by the offset guard (epoch or position)
	TxRolledBack    = "rolled_back"    // a processor, dead-letter or connection error
	TxCommitUnknown = "commit_unknown" // COMMIT sent, no answer: it may have taken effect
)

// Options configure a Tracer.
type Options struct {
	// Group is the consumer group (messaging.consumer.group.name).
	Group string
	// MaxLinks caps the links of one batch span; 0 means DefaultMaxLinks.
	MaxLinks int
}

// Tracer makes ratchet's spans. A nil *Tracer is tracing off: every method
// returns at once and the values it returns do nothing. It is safe for
// concurrent use.
type Tracer struct {
	tracer   trace.Tracer
	group    string
	maxLinks int
}

// New returns a Tracer whose spans go to tp, or nil (off) when tp is nil.
func New(tp trace.TracerProvider, o Options) *Tracer {
	if tp == nil {
		return nil
	}
	if o.MaxLinks <= 0 {
		o.MaxLinks = DefaultMaxLinks
	}
	return &Tracer{tracer: tp.Tracer(InstrumentationName), group: o.Group, maxLinks: o.MaxLinks}
}

// Ref refers to a span, as a parent or a link; the zero Ref refers to none.
type Ref struct{ sc trace.SpanContext }

// Valid reports whether r refers to a span.
func (r Ref) Valid() bool { return r.sc.IsValid() }

// SpanContext is the OpenTelemetry context r refers to.
func (r Ref) SpanContext() trace.SpanContext { return r.sc }

// TraceID is r's trace id in hex, or "" for none.
func (r Ref) TraceID() string {
	if !r.sc.IsValid() {
		return ""
	}
	return r.sc.TraceID().String()
}

// Span is one span; the zero Span (tracing off) does nothing.
type Span struct{ span trace.Span }

// Recording reports whether s is recorded (sampled); attributes set on a
// span that is not are thrown away, so callers may skip building them.
func (s Span) Recording() bool { return s.span != nil && s.span.IsRecording() }

// Ref refers to s.
func (s Span) Ref() Ref {
	if s.span == nil {
		return Ref{}
	}
	return Ref{sc: s.span.SpanContext()}
}

// LogAttr is the trace_id attribute for a log line about s, also once s
// has ended: the empty attribute, which log/slog leaves out, when s is not
// sampled (its trace is not exported, so its id would lead nowhere).
func (s Span) LogAttr() slog.Attr {
	if s.span == nil || !s.span.SpanContext().IsSampled() {
		return slog.Attr{}
	}
	return slog.String("trace_id", s.span.SpanContext().TraceID().String())
}

// Int sets an integer attribute.
func (s Span) Int(key string, v int64) {
	if s.Recording() {
		s.span.SetAttributes(attribute.Int64(key, v))
	}
}

// String sets a string attribute.
func (s Span) String(key, v string) {
	if s.Recording() {
		s.span.SetAttributes(attribute.String(key, v))
	}
}

// Bool sets a boolean attribute.
func (s Span) Bool(key string, v bool) {
	if s.Recording() {
		s.span.SetAttributes(attribute.Bool(key, v))
	}
}

// Event adds an event with no attributes.
func (s Span) Event(name string) {
	if s.Recording() {
		s.span.AddEvent(name)
	}
}

// Fail sets s's status to error with err's text, without ending it.
func (s Span) Fail(err error) {
	if s.Recording() && err != nil {
		s.span.SetStatus(codes.Error, err.Error())
	}
}

// End ends s; a non-nil err sets its status to error and records it.
func (s Span) End(err error) {
	if s.span == nil {
		return
	}
	if err != nil && s.span.IsRecording() {
		s.span.RecordError(err)
		s.span.SetStatus(codes.Error, err.Error())
	}
	s.span.End()
}

// endWith ends s with an outcome attribute.
func (s Span) endWith(outcome string, err error) {
	if s.span == nil {
		return
	}
	if s.span.IsRecording() {
		s.span.SetAttributes(attribute.String(AttrOutcome, outcome))
	}
	s.End(err)
}

// Start starts an internal span (a stop, a revoke, a claim) as a child of
// parent, or a root span when parent is the zero Ref.
func (t *Tracer) Start(name string, parent Ref) Span {
	if t == nil {
		return Span{}
	}
	_, sp := t.tracer.Start(parentContext(parent), name)
	return Span{span: sp}
}

func parentContext(parent Ref) context.Context {
	if !parent.sc.IsValid() {
		return context.Background()
	}
	return trace.ContextWithSpanContext(context.Background(), parent.sc)
}

// Batch is the `process <topic>` span of one batch.
type Batch struct {
	Span
	t    *Tracer
	name string
}

// StartBatch starts the span of a batch of msgs (in offset order) of one
// partition, a root span linking, when it is recorded, to the producer
// context of each record that carries a `traceparent` header, at most the
// Tracer's cap of them. The span's attributes account for every record:
// links + links.dropped + unlinked = messaging.batch.message_count.
func (t *Tracer) StartBatch(topic string, partition int32, msgs []*kafka.Message) Batch {
	if t == nil || len(msgs) == 0 {
		return Batch{}
	}
	name := "process " + topic
	_, sp := t.tracer.Start(context.Background(), name, trace.WithSpanKind(trace.SpanKindConsumer))
	if !sp.IsRecording() {
		return Batch{Span{span: sp}, t, name}
	}
	links, dropped, unlinked := 0, 0, 0
	for _, m := range msgs {
		sc := linkContext(m.Headers)
		switch {
		case !sc.IsValid():
			unlinked++
		case links >= t.maxLinks:
			dropped++
		default:
			sp.AddLink(trace.Link{SpanContext: sc})
			links++
		}
	}
	sp.SetAttributes(
		semconv.MessagingSystemKafka,
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingDestinationName(topic),
		semconv.MessagingDestinationPartitionID(strconv.Itoa(int(partition))),
		semconv.MessagingConsumerGroupName(t.group),
		semconv.MessagingBatchMessageCount(len(msgs)),
		attribute.Int64(AttrFirstOffset, int64(msgs[0].TopicPartition.Offset)),
		attribute.Int64(AttrLastOffset, int64(msgs[len(msgs)-1].TopicPartition.Offset)),
		attribute.Int(AttrLinks, links),
		attribute.Int(AttrLinksMax, t.maxLinks),
		attribute.Int(AttrLinksDropped, dropped),
		attribute.Int(AttrUnlinked, unlinked),
	)
	return Batch{Span{span: sp}, t, name}
}

// RestartBatch starts the span of a batch applied again after its first
// span ended (a batch whose processor panics, retried with its records
// isolated): a new `process` span linking to the first and to the
// producer contexts of records (the batch's decoded records).
func (t *Tracer) RestartBatch(first Batch, records []processor.Record) Batch {
	if t == nil || first.span == nil {
		return Batch{}
	}
	sc := first.span.SpanContext()
	_, sp := t.tracer.Start(context.Background(), first.name, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attribute.String("ratchet.link", "earlier attempt")}}))
	if !sp.IsRecording() {
		return Batch{Span{span: sp}, t, first.name}
	}
	links, dropped, unlinked := 0, 0, 0
	for i := range records {
		c := recordCarrier(records[i].Headers)
		if c.Get(HeaderTraceparent) == "" {
			unlinked++
			continue
		}
		rsc := trace.SpanContextFromContext(w3c.Extract(context.Background(), c))
		switch {
		case !rsc.IsValid():
			unlinked++
		case links >= t.maxLinks:
			dropped++
		default:
			sp.AddLink(trace.Link{SpanContext: rsc})
			links++
		}
	}
	sp.SetAttributes(
		semconv.MessagingSystemKafka,
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingBatchMessageCount(len(records)),
		semconv.MessagingConsumerGroupName(t.group),
		attribute.Int(AttrLinks, links),
		attribute.Int(AttrLinksMax, t.maxLinks),
		attribute.Int(AttrLinksDropped, dropped),
		attribute.Int(AttrUnlinked, unlinked),
		attribute.Bool("ratchet.batch.isolating_panic", true),
	)
	return Batch{Span{span: sp}, t, first.name}
}

// Retry records a failed attempt that is tried again: class is the error's
// class (transient, config, unclassified).
func (b Batch) Retry(attempt int, class string, err error) {
	if !b.Recording() {
		return
	}
	b.span.AddEvent("retry", trace.WithAttributes(
		semconv.ErrorTypeKey.String(class),
		attribute.Int(AttrAttempt, attempt),
		semconv.ExceptionMessage(err.Error()),
	))
}

// Bisect records one bisection step: the records of [start, next) are
// split at mid to find the one that fails, because of cause.
func (b Batch) Bisect(start, mid, next int64, cause error) {
	if !b.Recording() {
		return
	}
	b.span.AddEvent("bisect", trace.WithAttributes(
		attribute.Int64("ratchet.bisect.start", start),
		attribute.Int64("ratchet.bisect.mid", mid),
		attribute.Int64("ratchet.bisect.next", next),
		semconv.ExceptionMessage(cause.Error()),
	))
}

// RecordFailed marks the batch as holding a record that cannot be applied
// (it goes to the dead-letter topic): the span's status is an error.
func (b Batch) RecordFailed(offset int64, err error) {
	if !b.Recording() {
		return
	}
	b.span.AddEvent("record failed", trace.WithAttributes(
		semconv.MessagingKafkaOffset(int(offset)),
		semconv.ExceptionMessage(err.Error()),
	))
	b.span.SetStatus(codes.Error, "record error: "+err.Error())
}

// End ends the batch span with its outcome (Batch*); err, if any, sets the
// status.
func (b Batch) End(outcome string, err error) { b.endWith(outcome, err) }

// Tx is the span of one attempt at a batch's PostgreSQL transaction.
type Tx struct{ Span }

// StartTx starts the span of one transaction of the records of [start,
// next) of the batch (a bisection applies part of it).
func (b Batch) StartTx(start, next int64, records int) Tx {
	if b.span == nil {
		return Tx{}
	}
	ctx := trace.ContextWithSpan(context.Background(), b.span)
	_, sp := b.t.tracer.Start(ctx, "transaction", trace.WithSpanKind(trace.SpanKindClient))
	if sp.IsRecording() {
		sp.SetAttributes(
			semconv.DBSystemNamePostgreSQL,
			attribute.Int64("ratchet.transaction.start", start),
			attribute.Int64("ratchet.transaction.next", next),
			attribute.Int("ratchet.transaction.records", records),
		)
	}
	return Tx{Span{span: sp}}
}

// End ends the transaction span with its outcome (Tx*).
func (x Tx) End(outcome string, err error) { x.endWith(outcome, err) }

// Send is a `send <topic>` span (kind PRODUCER): one record produced.
type Send struct{ Span }

// StartSend starts the span of producing one record to topic, a child of
// parent (or a root span), linking to the context in link's `traceparent`
// when there is one: `ratchet dlq replay` links the replayed record to its
// dead letter that way.
func (t *Tracer) StartSend(parent Ref, topic string, link []kafka.Header) Send {
	if t == nil {
		return Send{}
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer)}
	if sc := Extract(link); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	_, sp := t.tracer.Start(parentContext(parent), "send "+topic, opts...)
	if sp.IsRecording() {
		sp.SetAttributes(
			semconv.MessagingSystemKafka,
			semconv.MessagingOperationTypeSend,
			semconv.MessagingOperationName("send"),
			semconv.MessagingDestinationName(topic),
		)
	}
	return Send{Span{span: sp}}
}

// StartSend starts the `send <dlq topic>` span of a dead letter of the
// batch, its child.
func (b Batch) StartSend(dlqTopic string) Send {
	if b.span == nil {
		return Send{}
	}
	return b.t.StartSend(b.Ref(), dlqTopic, nil)
}

// Inject returns headers with s's context as its `traceparent` (and
// `tracestate`) header, replacing any there were; headers unchanged when s
// is the zero Send. A context that is not sampled is carried too, as W3C
// Trace Context wants, so a consumer downstream continues the same trace.
func (s Send) Inject(headers []kafka.Header) []kafka.Header {
	if s.span == nil {
		return headers
	}
	return Inject(s.span.SpanContext(), headers)
}

// StartCommit starts the span of one commit of Kafka offsets of
// partitions, a child of parent (a revoke's or a stop's flush) or a root
// span (the periodic commit), linking to the last batch applied of each
// partition committed (zero Refs are skipped).
func (t *Tracer) StartCommit(parent Ref, partitions int, batches []Ref) Span {
	if t == nil {
		return Span{}
	}
	_, sp := t.tracer.Start(parentContext(parent), "commit", trace.WithSpanKind(trace.SpanKindClient))
	if !sp.IsRecording() {
		return Span{span: sp}
	}
	sp.SetAttributes(
		semconv.MessagingSystemKafka,
		semconv.MessagingOperationTypeSettle,
		semconv.MessagingOperationName("commit"),
		semconv.MessagingConsumerGroupName(t.group),
		attribute.Int("ratchet.commit.partitions", partitions),
	)
	for i, r := range batches {
		if i >= t.maxLinks {
			break
		}
		if r.sc.IsValid() {
			sp.AddLink(trace.Link{SpanContext: r.sc})
		}
	}
	return Span{span: sp}
}
