package kafkaclient_test

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/internal/kafkaclient"
	"ratchet/internal/testenv"
)

// TestBacklogFetchReachesEveryPartition holds the fetch settings to what a
// backlog drain needs: every partition's records arrive from the start, not
// a few partitions after another. librdkafka caps a fetch at the prefetch
// bound of the whole consumer (queued.max.messages.kbytes, 2 MiB here), so
// with its default of 1 MiB a partition two partitions filled every fetch
// (make bench showed partitions 0 and 1 drained before 2 and 3 began, so
// only two partition actors ever worked at once). It fails on those
// settings.
func TestBacklogFetchReachesEveryPartition(t *testing.T) {
	const (
		partitions = 12
		perPart    = 8000 // 8000 × 256 random bytes ≈ 2 MiB a partition
	)
	_, addr := testenv.Kafka(t, partitions, "backlog")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	// Record batches of 64 KiB, so what a fetch returns for a partition
	// is set by the consumer's limits, not by a single large batch
	// (a broker always returns at least one whole batch).
	p, err := kafkaclient.NewProducer([]string{addr}, map[string]string{"batch.size": "65536"}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	topic := "backlog"
	rng := rand.New(rand.NewPCG(1, 2))
	for part := range int32(partitions) {
		for range perPart {
			v := make([]byte, 256) // random: lz4 cannot shrink it below the fetch sizes
			for i := range v {
				v[i] = byte(rng.Uint32())
			}
			msg := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: part}, Value: v}
			for {
				err := p.Produce(msg, nil)
				if err == nil {
					break
				}
				if kerr, ok := err.(kafka.Error); !ok || kerr.Code() != kafka.ErrQueueFull {
					t.Fatal(err)
				}
				p.Flush(100)
			}
		}
	}
	go func() {
		for range p.Events() { // delivery reports
		}
	}()
	if left := p.Flush(30_000); left != 0 {
		t.Fatalf("%d records not delivered", left)
	}

	c, err := kafkaclient.NewConsumer(kafkaclient.ConsumerOptions{Brokers: []string{addr}, GroupID: "fairness"}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Subscribe(topic, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Within the first quarter of the backlog, every partition must have
	// delivered records. Read one partition after another, the first
	// quarter holds three partitions.
	quarter := partitions * perPart / 4
	seen := make(map[int32]int)
	for n := 0; n < quarter; {
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records before the deadline", n, quarter)
		}
		m, ok := c.Poll(100).(*kafka.Message)
		if !ok {
			continue
		}
		if m.TopicPartition.Error != nil {
			t.Fatal(m.TopicPartition.Error)
		}
		seen[m.TopicPartition.Partition]++
		n++
	}
	if len(seen) != partitions {
		t.Fatalf("the first %d records came from %d of %d partitions (%v): a backlog is fetched a few partitions at a time",
			quarter, len(seen), partitions, seen)
	}
}

// TestProducerChannelsAreSmall: confluent-kafka-go allocates a producer's
// Go channels at their configured size when the producer is created, at
// 1,000,000 entries each by default: 24 MB of heap in every ratchet
// instance (the DLQ producer), which the soft memory limit counts and the
// collector scans on every cycle.
func TestProducerChannelsAreSmall(t *testing.T) {
	_, addr := testenv.Kafka(t, 1, "events")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	p, err := kafkaclient.NewProducer([]string{addr}, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 4<<20 {
		t.Fatalf("creating a producer grew the heap by %d MiB", grown>>20)
	}
}

// TestFetchWaitFollowsThePartitions: an idle consumer sends one fetch of
// every partition per fetch.wait.max.ms, so the default wait grows past
// 512 partitions (100 ms below, at most 500 ms), and kafka.properties still
// decides.
func TestFetchWaitFollowsThePartitions(t *testing.T) {
	for _, c := range []struct{ partitions, want int }{
		{0, 100}, {12, 100}, {512, 100}, {768, 150}, {1024, 200}, {4096, 500},
	} {
		m := kafkaclient.ConsumerConfig(kafkaclient.ConsumerOptions{Brokers: []string{"x:9092"}, GroupID: "g", Partitions: c.partitions})
		if got, _ := m.Get("fetch.wait.max.ms", nil); got != c.want {
			t.Errorf("%d partitions: fetch.wait.max.ms = %v, want %d", c.partitions, got, c.want)
		}
	}
	m := kafkaclient.ConsumerConfig(kafkaclient.ConsumerOptions{Brokers: []string{"x:9092"}, GroupID: "g", Partitions: 1024,
		Properties: map[string]string{"fetch.wait.max.ms": "50"}})
	if got, _ := m.Get("fetch.wait.max.ms", nil); got != "50" {
		t.Errorf("kafka.properties fetch.wait.max.ms 50 gave %v", got)
	}
}
