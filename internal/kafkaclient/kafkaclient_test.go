package kafkaclient_test

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strings"
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

// userProperties are kafka.properties a user sets for the consumer, for
// the producer and for both.
var userProperties = map[string]string{
	"session.timeout.ms":            "45000",
	"heartbeat.interval.ms":         "3000",
	"max.poll.interval.ms":          "300000",
	"fetch.min.bytes":               "1",
	"fetch.max.bytes":               "52428800",
	"isolation.level":               "read_committed",
	"queued.min.messages":           "1000",
	"coordinator.query.interval.ms": "600000",
	"linger.ms":                     "20",
	"batch.size":                    "65536",
	"compression.type":              "zstd",
	"message.timeout.ms":            "60000",
	"client.id":                     "ratchet-test",
	"socket.keepalive.enable":       "true",
	"debug":                         "conf", // "Client configuration:" ends what rd_kafka_new logs
}

// TestPropertiesGoToTheirClient: consumer-only kafka.properties
// (session.timeout.ms, fetch.*, ...) reach the consumer only and
// producer-only ones (linger.ms, compression.type, ...) the producer only,
// so neither warns at start that it ignores a property, while the
// properties of both reach both. A producer given the consumer's
// properties does warn (the check below can fail).
func TestPropertiesGoToTheirClient(t *testing.T) {
	_, addr := testenv.Kafka(t, 1, "events")
	brokers := []string{addr}

	producerCfg := kafkaclient.ProducerConfig(brokers, userProperties)
	consumerCfg := kafkaclient.ConsumerConfig(kafkaclient.ConsumerOptions{Brokers: brokers, GroupID: "g", Properties: userProperties})
	for k := range *producerCfg {
		if kafkaclient.ConsumerOnly(k) {
			t.Errorf("the producer's configuration has the consumer-only %s", k)
		}
	}
	for k := range *consumerCfg {
		if kafkaclient.ProducerOnly(k) {
			t.Errorf("the consumer's configuration has the producer-only %s", k)
		}
	}
	for _, k := range []string{"linger.ms", "compression.type", "client.id", "socket.keepalive.enable"} {
		if v, _ := producerCfg.Get(k, nil); v != userProperties[k] {
			t.Errorf("producer %s = %v, want %s", k, v, userProperties[k])
		}
	}
	for _, k := range []string{"session.timeout.ms", "isolation.level", "client.id", "socket.keepalive.enable"} {
		if v, _ := consumerCfg.Get(k, nil); v != userProperties[k] {
			t.Errorf("consumer %s = %v, want %s", k, v, userProperties[k])
		}
	}

	// started tells when rd_kafka_new has logged all it logs at start:
	// its configuration warnings come before the configuration dump.
	started := func(buf *testenv.Buffer) func() bool {
		return func() bool { return len(buf.Lines("Client configuration")) > 0 }
	}
	const ignored = "will be ignored by this"

	// The control: every property given to a producer as it is.
	raw := kafka.ConfigMap{"bootstrap.servers": addr, "go.logs.channel.enable": true}
	for k, v := range userProperties {
		raw[k] = v
	}
	p, err := kafka.NewProducer(&raw)
	if err != nil {
		t.Fatal(err)
	}
	var rawLogs testenv.Buffer
	go func() { // ends when p.Close closes the channel
		for ev := range p.Logs() {
			rawLogs.Write([]byte(ev.Tag + " " + ev.Message + "\n"))
		}
	}()
	testenv.Eventually(t, 30*time.Second, started(&rawLogs), "the raw producer logs its configuration")
	if w := rawLogs.Lines(ignored); len(w) < 8 {
		t.Errorf("a producer given 8 consumer properties warned %d times: %q", len(w), w)
	}
	p.Close()

	for _, client := range []string{"producer", "consumer"} {
		t.Run(client, func(t *testing.T) {
			var buf testenv.Buffer
			log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
			if client == "producer" {
				p, err := kafkaclient.NewProducer(brokers, userProperties, log)
				if err != nil {
					t.Fatal(err)
				}
				defer p.Close()
			} else {
				c, err := kafkaclient.NewConsumer(kafkaclient.ConsumerOptions{Brokers: brokers, GroupID: "g", Properties: userProperties}, log)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
			}
			testenv.Eventually(t, 30*time.Second, started(&buf), "the %s logs its configuration", client)
			if w := buf.Lines(ignored); len(w) > 0 {
				t.Errorf("the %s warns that it ignores properties:\n%s", client, strings.Join(w, "\n"))
			}
		})
	}
}
