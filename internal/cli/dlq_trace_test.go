package cli

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"ratchet/actors"
	"ratchet/config"
	"ratchet/internal/testenv"
	"ratchet/internal/tracing"
)

// TestReplayLinksToTheDeadLetter: with tracing on, `dlq replay --execute`
// is one `dlq replay` trace whose `send` span per record links to the
// context its dead letter carries, and the replayed record carries that
// send span's context.
func TestReplayLinksToTheDeadLetter(t *testing.T) {
	_, addr := testenv.Kafka(t, 2, opsTopic, opsTopic+".dlq")
	o := newOpsEnv(t, addr, config.ModeExactlyOnce)
	cfg := o.config(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tr := tracing.New(tp, tracing.Options{Group: cfg.Kafka.GroupID})

	// Dead letters as the DLQ actor writes them, each with the context of
	// the `send <dlq topic>` span it was written under.
	const n = 4
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": addr, "log_level": 3})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dlq := opsTopic + ".dlq"
	letters := map[string]trace.SpanContext{} // ratchet.replayed_from value → the dead letter's span
	deliveries := make(chan kafka.Event, n)
	for i := range n {
		send := tr.StartSend(tracing.Ref{}, dlq, nil)
		headers := send.Inject([]kafka.Header{
			{Key: actors.HeaderError, Value: []byte("processor: permanent")},
			{Key: actors.HeaderTopic, Value: []byte(opsTopic)},
			{Key: actors.HeaderPartition, Value: []byte("0")},
			{Key: actors.HeaderOffset, Value: []byte(strconv.Itoa(i))},
			{Key: actors.HeaderAttempts, Value: []byte("1")},
			{Key: actors.HeaderFailedAt, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
		})
		send.End(nil)
		err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &dlq, Partition: 0},
			Key: []byte(fmt.Sprint("k", i)), Value: eventBytes(fmt.Sprint("dead-", i), 1), Headers: headers, Opaque: tracing.Extract(headers)}, deliveries)
		if err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		m := (<-deliveries).(*kafka.Message)
		if m.TopicPartition.Error != nil {
			t.Fatal(m.TopicPartition.Error)
		}
		letters[fmt.Sprintf("%s/%d/%d", dlq, m.TopicPartition.Partition, m.TopicPartition.Offset)] = m.Opaque.(trace.SpanContext)
	}

	var out bytes.Buffer
	if _, err := replay(context.Background(), &out, cfg, replayOptions{execute: true, tracer: tr}, nil); err != nil {
		t.Fatalf("replay: %v\n%s", err, out.String())
	}

	sends := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	var run sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "send " + opsTopic:
			sends[s.SpanContext().SpanID()] = s
		case "dlq replay":
			run = s
		}
	}
	if run == nil || len(sends) != n {
		t.Fatalf("%d replay send spans and run span %v, want %d and one", len(sends), run, n)
	}
	replayed := replayedRecords(t, o)
	if len(replayed) != n {
		t.Fatalf("%d dead letters replayed, want %d", len(replayed), n)
	}
	for from, ms := range replayed {
		letter, ok := letters[from]
		if !ok {
			t.Fatalf("replayed from %q, not one of the dead letters %v", from, letters)
		}
		sc := tracing.Extract(ms[0].Headers)
		s, ok := sends[sc.SpanID()]
		if !ok {
			t.Errorf("record replayed from %s carries span %s, not a replay send span", from, sc.SpanID())
			continue
		}
		if s.Parent().SpanID() != run.SpanContext().SpanID() {
			t.Errorf("replay send span of %s is not a child of the run", from)
		}
		if len(s.Links()) != 1 || s.Links()[0].SpanContext.SpanID() != letter.SpanID() {
			t.Errorf("replay send span of %s links %v, want its dead letter's span %s", from, s.Links(), letter.SpanID())
		}
	}
}
