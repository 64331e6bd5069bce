package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/event"
	"ratchet/internal/testenv"
	"ratchet/processor"
)

// seen is a processor that remembers the last version of every record it
// was given (a batch may be given again after a failure).
type seen struct {
	mu   sync.Mutex
	recs map[int64]processor.Record // by offset; one partition
}

func (*seen) Name() string { return "seen" }

func (s *seen) Process(_ context.Context, _ pgx.Tx, b processor.Batch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range b.Records {
		s.recs[r.Offset] = r
	}
	return nil
}

func (s *seen) snapshot() map[int64]processor.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[int64]processor.Record, len(s.recs))
	for k, v := range s.recs {
		out[k] = v
	}
	return out
}

// produceMessages writes msgs to the input topic and waits for them.
func produceMessages(tb testing.TB, addr string, msgs []*kafka.Message) {
	tb.Helper()
	pr := newProducer(tb, addr)
	deliveries := make(chan kafka.Event, len(msgs))
	for _, m := range msgs {
		if err := pr.p.Produce(m, deliveries); err != nil {
			tb.Fatal(err)
		}
	}
	for range msgs {
		select {
		case d := <-deliveries:
			if m := d.(*kafka.Message); m.TopicPartition.Error != nil {
				tb.Fatal(m.TopicPartition.Error)
			}
		case <-time.After(60 * time.Second):
			tb.Fatal("no delivery within 60s")
		}
	}
}

// TestRawRecordsWithMetadata: with kafka.format raw, a custom processor
// gets every value as produced, with its key, headers and timestamp.
func TestRawRecordsWithMetadata(t *testing.T) {
	_, addr := testenv.Kafka(t, 1, topic)
	cfg := testConfig(t, addr, testenv.Postgres(t), config.ModeExactlyOnce)
	cfg.Kafka.Format = event.FormatRaw
	p := &seen{recs: map[int64]processor.Record{}}
	startWith(t, cfg, engine.Options{Processor: p}, testenv.Log{})
	tp := topic
	base := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	var msgs []*kafka.Message
	for i := range 20 {
		msgs = append(msgs, &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &tp, Partition: 0},
			Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte(fmt.Sprintf("\x00raw bytes %d", i)),
			Timestamp: base.Add(time.Duration(i) * time.Second),
			Headers:   []kafka.Header{{Key: "trace-id", Value: []byte(strconv.Itoa(i))}, {Key: "source", Value: []byte("test")}}})
	}
	produceMessages(t, addr, msgs)
	testenv.Eventually(t, 60*time.Second, func() bool { return len(p.snapshot()) == 20 }, "20 records processed")
	for off, r := range p.snapshot() {
		i := int(off)
		if string(r.Key) != fmt.Sprintf("k%d", i) || string(r.Value) != fmt.Sprintf("\x00raw bytes %d", i) || r.Event != nil {
			t.Errorf("offset %d: key %q value %q event %v", off, r.Key, r.Value, r.Event)
		}
		if v, _ := r.Header("trace-id"); string(v) != strconv.Itoa(i) || len(r.Headers) != 2 || r.Headers[1].Key != "source" {
			t.Errorf("offset %d: headers %v", off, r.Headers)
		}
		if !r.Timestamp.Equal(base.Add(time.Duration(i)*time.Second)) || r.TimestampType != processor.TimestampCreateTime {
			t.Errorf("offset %d: timestamp %v (%v)", off, r.Timestamp, r.TimestampType)
		}
	}
}

// TestCustomDecoder: a decoder of the user's own message type; what it
// refuses is dead-lettered with its reason, the rest reaches the processor
// in Record.Decoded.
func TestCustomDecoder(t *testing.T) {
	cluster, addr := testenv.Kafka(t, 1, topic)
	cfg := testConfig(t, addr, testenv.Postgres(t), config.ModeExactlyOnce)
	p := &seen{recs: map[int64]processor.Record{}}
	type order struct{ qty int }
	dec := processor.DecoderFunc(func(r *processor.Record) error {
		n, err := strconv.Atoi(string(r.Value))
		if err != nil {
			return errors.New("not an order quantity")
		}
		r.Decoded = order{qty: n}
		return nil
	})
	startWith(t, cfg, engine.Options{Processor: p, Decoder: dec}, testenv.Log{})
	tp := topic
	var msgs []*kafka.Message
	for i := range 10 {
		v := strconv.Itoa(i * 10)
		if i == 4 {
			v = "four"
		}
		msgs = append(msgs, &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &tp, Partition: 0}, Key: []byte(v), Value: []byte(v)})
	}
	produceMessages(t, addr, msgs)
	got := readDLQ(t, cluster, addr, cfg.Kafka.DLQTopic(topic), 1)
	if len(got) != 1 || got[0].offset != 4 || !strings.Contains(got[0].headers["ratchet.error"], "not an order quantity") {
		t.Errorf("dead letters %+v, want offset 4 with the decoder's reason", got)
	}
	testenv.Eventually(t, 60*time.Second, func() bool { return len(p.snapshot()) == 9 }, "9 records processed")
	for off, r := range p.snapshot() {
		if o, ok := r.Decoded.(order); !ok || o.qty != int(off)*10 {
			t.Errorf("offset %d decoded as %#v", off, r.Decoded)
		}
	}
}

// TestDashboardRefusesRaw: the built-in processor reads events, so a raw
// topic stops the start with a configuration error naming the key; a
// custom processor, or a custom decoder, may use raw.
func TestDashboardRefusesRaw(t *testing.T) {
	cfg := config.Default()
	cfg.Kafka.Topics = []string{"a", "b"}
	cfg.Kafka.TopicFormats = map[string]string{"b": event.FormatRaw}
	err := engine.Run(context.Background(), cfg, engine.Options{Logger: testenv.Log{}.Logger()})
	var ce *config.Error
	if !errors.As(err, &ce) || len(ce.Problems) != 1 || ce.Problems[0].Key != "kafka.topic_formats.b" {
		t.Fatalf("Run = %v, want a config error naming kafka.topic_formats.b", err)
	}
	if err := engine.Check(cfg, engine.Options{Processor: &seen{}}); err != nil {
		t.Errorf("custom processor on raw: %v", err)
	}
	if err := engine.Check(cfg, engine.Options{Decoder: processor.DecoderFunc(func(*processor.Record) error { return nil })}); err != nil {
		t.Errorf("dashboard with a custom decoder: %v", err)
	}
}
