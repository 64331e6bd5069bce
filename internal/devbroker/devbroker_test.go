package devbroker

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func startBroker(tb testing.TB, opts Options) *Broker {
	tb.Helper()
	if opts.Logger == nil {
		opts.Logger = quietLogger()
	}
	b, err := Start(opts)
	if err != nil {
		tb.Fatalf("start: %v", err)
	}
	tb.Cleanup(b.Close)
	return b
}

func TestStartSeedsTopics(t *testing.T) {
	b := startBroker(t, Options{Addr: "127.0.0.1:0", Topics: []string{"a", "b", "c"}, Partitions: 4})
	if strings.HasSuffix(b.Addr(), ":0") || !strings.HasPrefix(b.Addr(), "127.0.0.1:") {
		t.Fatalf("Addr() = %q, want 127.0.0.1 with a real port", b.Addr())
	}

	admin, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": b.Addr(), "log_level": 3})
	if err != nil {
		t.Fatalf("admin client: %v", err)
	}
	defer admin.Close()
	md, err := admin.GetMetadata(nil, true, 10_000)
	if err != nil {
		t.Fatalf("metadata: %v", err)
	}
	if len(md.Brokers) != 1 {
		t.Errorf("brokers = %d, want 1", len(md.Brokers))
	}
	for _, topic := range []string{"a", "b", "c"} {
		t.Run(topic, func(t *testing.T) {
			tm, ok := md.Topics[topic]
			if !ok {
				t.Fatalf("topic %s missing from metadata", topic)
			}
			if tm.Error.Code() != kafka.ErrNoError {
				t.Fatalf("topic %s: %v", topic, tm.Error)
			}
			if len(tm.Partitions) != 4 {
				t.Errorf("topic %s has %d partitions, want 4", topic, len(tm.Partitions))
			}
		})
	}
	if b.Cluster().TopicInfo("a") == nil {
		t.Error("Cluster().TopicInfo(a) = nil")
	}
}

func TestDefaultPartitionsAndAutoCreate(t *testing.T) {
	b := startBroker(t, Options{Addr: "localhost:0", Topics: []string{"events"}})
	if got := len(b.Cluster().PartitionInfos("events")); got != int(DefaultPartitions) {
		t.Errorf("events has %d partitions, want %d", got, DefaultPartitions)
	}
	// A producer asks for auto-creation of a topic it writes to.
	produce(t, b.Addr(), "auto", 1)
	if got := len(b.Cluster().PartitionInfos("auto")); got != int(DefaultPartitions) {
		t.Errorf("auto-created topic has %d partitions, want %d", got, DefaultPartitions)
	}
}

func TestDataDirPersists(t *testing.T) {
	dir := t.TempDir()
	first, err := Start(Options{Addr: "127.0.0.1:0", Topics: []string{"events"}, Partitions: 3, DataDir: dir, Logger: quietLogger()})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	addr := first.Addr()
	want := produce(t, addr, "events", 10)
	first.Close()
	first.Close() // idempotent

	// The second start also asks for a new topic: persisted topics are kept,
	// the new one is created.
	second := startBroker(t, Options{Addr: addr, Topics: []string{"events", "extra"}, Partitions: 5, DataDir: dir})
	if second.Addr() != addr {
		t.Fatalf("restarted on %s, want %s", second.Addr(), addr)
	}
	if got := len(second.Cluster().PartitionInfos("events")); got != 3 {
		t.Errorf("persisted topic has %d partitions after restart, want 3", got)
	}
	if got := len(second.Cluster().PartitionInfos("extra")); got != 5 {
		t.Errorf("new topic has %d partitions, want 5", got)
	}
	got := consumeAll(t, addr, "events", 3, len(want))
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("after restart read %v, want %v", got, want)
	}
}

func TestPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	b, err := Start(Options{Addr: addr, Logger: quietLogger()})
	if err == nil {
		b.Close()
		t.Fatalf("Start on busy %s succeeded", addr)
	}
	if !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "already in use") {
		t.Errorf("error %q does not say that %s is in use", err, addr)
	}
}

func TestRejectsBadAddr(t *testing.T) {
	tests := []struct {
		name, addr, want string
	}{
		{"all interfaces", "0.0.0.0:9092", "127.0.0.1 only"},
		{"other host", "10.1.2.3:9092", "127.0.0.1 only"},
		{"ipv6 loopback", "[::1]:9092", "127.0.0.1 only"},
		{"hostname", "kafka:9092", "127.0.0.1 only"},
		{"no port", "127.0.0.1", "missing port"},
		{"bad port", "127.0.0.1:http", "port must be a number"},
		{"port too big", "127.0.0.1:70000", "port must be a number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := Start(Options{Addr: tt.addr, Logger: quietLogger()})
			if err == nil {
				b.Close()
				t.Fatalf("Start(%q) succeeded", tt.addr)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Start(%q) error %q, want it to contain %q", tt.addr, err, tt.want)
			}
		})
	}
}

func TestNegativePartitions(t *testing.T) {
	if _, err := Start(Options{Addr: "127.0.0.1:0", Partitions: -1}); err == nil {
		t.Fatal("Start with -1 partitions succeeded")
	}
}

// produce writes n records to topic and waits for every delivery report. It
// returns the values written.
func produce(tb testing.TB, addr, topic string, n int) []string {
	tb.Helper()
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": addr, "linger.ms": 0, "log_level": 3})
	if err != nil {
		tb.Fatalf("producer: %v", err)
	}
	defer p.Close()
	reports := make(chan kafka.Event, n)
	var values []string
	for i := range n {
		v := fmt.Sprintf("value-%d", i)
		values = append(values, v)
		err := p.Produce(&kafka.Message{
			TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
			Key:            []byte(fmt.Sprintf("key-%d", i)),
			Value:          []byte(v),
		}, reports)
		if err != nil {
			tb.Fatalf("produce: %v", err)
		}
	}
	timeout := time.After(15 * time.Second)
	for range n {
		select {
		case ev := <-reports:
			m, ok := ev.(*kafka.Message)
			if !ok {
				tb.Fatalf("unexpected delivery event %v", ev)
			}
			if m.TopicPartition.Error != nil {
				tb.Fatalf("delivery: %v", m.TopicPartition.Error)
			}
		case <-timeout:
			tb.Fatal("delivery reports did not arrive within 15s")
		}
	}
	return values
}

// consumeAll reads every partition of topic from the beginning until it has
// n values.
func consumeAll(tb testing.TB, addr, topic string, partitions int32, n int) []string {
	tb.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{
		"bootstrap.servers":  addr,
		"group.id":           "devbroker-test",
		"enable.auto.commit": false,
		"log_level":          3,
	})
	if err != nil {
		tb.Fatalf("consumer: %v", err)
	}
	defer c.Close()
	var tps []kafka.TopicPartition
	for p := range partitions {
		tps = append(tps, kafka.TopicPartition{Topic: &topic, Partition: p, Offset: kafka.OffsetBeginning})
	}
	if err := c.Assign(tps); err != nil {
		tb.Fatalf("assign: %v", err)
	}
	var got []string
	deadline := time.Now().Add(15 * time.Second)
	for len(got) < n {
		if time.Now().After(deadline) {
			tb.Fatalf("read %d of %d records within 15s", len(got), n)
		}
		switch ev := c.Poll(100).(type) {
		case *kafka.Message:
			if ev.TopicPartition.Error != nil {
				tb.Fatalf("consume: %v", ev.TopicPartition.Error)
			}
			got = append(got, string(ev.Value))
		case kafka.Error:
			tb.Logf("consumer: %v", ev)
		}
	}
	return got
}
