package actors

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"

	"ratchet/internal/metrics"
	"ratchet/internal/store"
	"ratchet/internal/testenv"
	"ratchet/processor"
)

// recordingApplier records every batch it applies.
type recordingApplier struct {
	mu      sync.Mutex
	batches []processor.Batch
}

func (a *recordingApplier) ApplyWith(_ context.Context, b processor.Batch, _ *store.Claim, _ store.ApplyOptions) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.batches = append(a.batches, b)
	return nil
}

func (a *recordingApplier) records() []processor.Record {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []processor.Record
	for _, b := range a.batches {
		out = append(out, b.Records...)
	}
	return out
}

// countingDLQ counts dead letters.
type countingDLQ struct{ n atomic.Int64 }

func (d *countingDLQ) DeadLetter(_ context.Context, letters []Letter) error {
	d.n.Add(int64(len(letters)))
	return nil
}

// lookupDecoder is a Resolver whose values name a key to look up (the
// first byte); Resolve fails while down is set.
type lookupDecoder struct {
	known    map[byte]bool // partition goroutine only
	down     atomic.Bool
	attempts atomic.Int64
}

func (d *lookupDecoder) DecodeRecord(rec *processor.Record) error {
	if !d.known[rec.Value[0]] {
		return errors.New("decoded before its lookup")
	}
	rec.Decoded = string(rec.Value)
	return nil
}

func (d *lookupDecoder) Missing(v []byte) bool { return !d.known[v[0]] }

func (d *lookupDecoder) Resolve(_ context.Context, values [][]byte) (func(), error) {
	d.attempts.Add(1)
	if d.down.Load() {
		return nil, errors.New("registry unreachable")
	}
	keys := make([]byte, len(values))
	for i, v := range values {
		keys[i] = v[0]
	}
	return func() {
		for _, k := range keys {
			d.known[k] = true
		}
	}, nil
}

func startDecodingPartition(t *testing.T, app Applier, dlq DeadLetterer, dec ValueDecoder) (*actor.ActorSystem, *actor.PID, *PartitionConfig) {
	t.Helper()
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
	sink := sys.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
	cfg := &PartitionConfig{
		TP: TopicPartition{Topic: "events", Partition: 0}, Start: 0, BatchSize: 4, Linger: time.Millisecond,
		Retry:   RetryPolicy{InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, MaxAttempts: 1},
		Applier: app, Committer: sink, DLQ: dlq, DLQTopic: "events.dlq",
		Held: NewHeld(nil), Progress: &Progress{}, PanicLimit: 3,
		Seek:    func(*actor.PID, TopicPartition, int64) {},
		Metrics: metrics.New(prometheus.NewRegistry()),
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if dec != nil {
		cfg.NewDecoder = func(string) ValueDecoder { return dec }
	} else {
		cfg.Format = "raw"
	}
	pid := sys.Root.Spawn(actor.PropsFromProducer(NewPartition(cfg)))
	t.Cleanup(func() { _ = sys.Root.StopFuture(pid).Wait() })
	return sys, pid, cfg
}

func message(offset int64, value []byte) *kafka.Message {
	topic := "events"
	return &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Offset: kafka.Offset(offset)}, Value: value}
}

// TestPartitionWaitsForLookups: while the decoder's lookups fail (a schema
// registry down), the partition applies nothing, dead-letters nothing and
// reports degraded; once they succeed every record is applied once, in
// order.
func TestPartitionWaitsForLookups(t *testing.T) {
	app, dlq := &recordingApplier{}, &countingDLQ{}
	dec := &lookupDecoder{known: map[byte]bool{}}
	dec.down.Store(true)
	sys, pid, cfg := startDecodingPartition(t, app, dlq, dec)

	var msgs []*kafka.Message
	for off := range int64(10) {
		msgs = append(msgs, message(off, []byte{byte('a' + off%3)}))
	}
	cfg.Held.Add(len(msgs), messagesBytes(msgs))
	sys.Root.Send(pid, &Records{Msgs: msgs})

	testenv.Eventually(t, 10*time.Second, func() bool {
		return dec.attempts.Load() >= 3 && cfg.Progress.Degraded.Load()
	}, "lookups retried and the partition degraded")
	if n := len(app.records()); n != 0 {
		t.Fatalf("%d records applied while their lookups failed", n)
	}
	dec.down.Store(false)
	testenv.Eventually(t, 10*time.Second, func() bool { return len(app.records()) == 10 }, "all records applied")
	for i, r := range app.records() {
		if r.Offset != int64(i) || r.Decoded != string([]byte{byte('a' + i%3)}) {
			t.Errorf("record %d: offset %d decoded %v", i, r.Offset, r.Decoded)
		}
	}
	if n := dlq.n.Load(); n != 0 {
		t.Errorf("%d records dead-lettered during the outage", n)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return !cfg.Progress.Degraded.Load() }, "degraded cleared")
}

// TestPartitionPassesRecordMetadata: key, headers, timestamp and its type
// reach the processor as the consumer returned them, and raw values are
// passed undecoded.
func TestPartitionPassesRecordMetadata(t *testing.T) {
	app := &recordingApplier{}
	sys, pid, cfg := startDecodingPartition(t, app, &countingDLQ{}, nil)
	ts := time.UnixMilli(1_700_000_000_123)
	m := message(0, []byte("not an event"))
	m.Key = []byte("k1")
	m.Timestamp, m.TimestampType = ts, kafka.TimestampLogAppendTime
	m.Headers = []kafka.Header{{Key: "trace", Value: []byte("t1")}, {Key: "trace", Value: []byte("t2")}, {Key: "empty"}}
	cfg.Held.Add(1, recordBytes(m))
	sys.Root.Send(pid, &Records{Msgs: []*kafka.Message{m}})
	testenv.Eventually(t, 10*time.Second, func() bool { return len(app.records()) == 1 }, "the record applied")
	r := app.records()[0]
	if string(r.Key) != "k1" || string(r.Value) != "not an event" || r.Event != nil {
		t.Errorf("key %q value %q event %v", r.Key, r.Value, r.Event)
	}
	if !r.Timestamp.Equal(ts) || r.TimestampType != processor.TimestampLogAppendTime {
		t.Errorf("timestamp %v (%v), want %v (log-append-time)", r.Timestamp, r.TimestampType, ts)
	}
	if len(r.Headers) != 3 || r.Headers[1].Key != "trace" || string(r.Headers[1].Value) != "t2" {
		t.Errorf("headers %+v", r.Headers)
	}
	if v, ok := r.Header("trace"); !ok || string(v) != "t2" {
		t.Errorf("Header(trace) = %q, %v; want the last one, t2", v, ok)
	}
	if &r.Value[0] != &m.Value[0] || &r.Key[0] != &m.Key[0] || &r.Headers[0].Value[0] != &m.Headers[0].Value[0] {
		t.Error("key, value or header value copied; they should share the consumer's memory")
	}
}
