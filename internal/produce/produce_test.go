package produce

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"ratchet/internal/event"
	"ratchet/internal/testenv"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// record is what a consumer read back.
type record struct {
	key, value []byte
	partition  int32
}

// consume reads topic from the beginning with franz-go (an implementation
// independent of librdkafka) until it has n records, then checks for a few
// more milliseconds that nothing beyond n is there.
func consume(tb testing.TB, addr, topic string, n int) []record {
	tb.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(addr),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	if err != nil {
		tb.Fatalf("kgo client: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var got []record
	for len(got) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			tb.Fatalf("read %d of %d records within 20s", len(got), n)
		}
		fs.EachError(func(t string, p int32, err error) { tb.Fatalf("fetch %s[%d]: %v", t, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			got = append(got, record{key: r.Key, value: r.Value, partition: r.Partition})
		})
	}
	if len(got) != n {
		tb.Fatalf("read %d records, want %d", len(got), n)
	}
	return got
}

func TestRun(t *testing.T) {
	tests := []struct {
		name   string
		format string
		props  map[string]string
	}{
		{"protobuf lz4", event.FormatProtobuf, nil},
		// A 50-record local queue forces the queue-full path: every record
		// must still arrive.
		{"json queue full", event.FormatJSON, map[string]string{"queue.buffering.max.messages": "50", "compression.type": "none"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, addr := testenv.Kafka(t, 4, "events")
			opts := Options{
				Brokers:        []string{addr},
				Topic:          "events",
				Count:          2000,
				PoisonFraction: 0.05,
				Format:         tt.format,
				Seed:           42,
				Properties:     tt.props,
				TimeSpread:     5 * time.Minute,
				Now:            fixedClock,
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			stats, err := Run(ctx, opts, quietLogger())
			if err != nil {
				t.Fatalf("Run: %v", err)
			}

			// What the generator says was written, computed independently.
			g := NewGenerator(opts)
			type want struct {
				value  []byte
				poison bool
				kind   PoisonKind
			}
			wants := make(map[string]want)
			var wantPoison int64
			for range opts.Count {
				key, value, _, poison := g.Next()
				wants[string(key)] = want{value, poison, g.LastPoisonKind()}
				if poison {
					wantPoison++
				}
			}
			if stats != (Stats{Produced: 2000, Poison: wantPoison, Failed: 0}) {
				t.Errorf("stats = %+v, want 2000 produced, %d poison", stats, wantPoison)
			}
			if wantPoison < 50 || wantPoison > 150 {
				t.Errorf("%d poison of 2000 at 5%%", wantPoison)
			}

			got := consume(t, addr, "events", 2000)
			partitions := make(map[int32]int)
			var poison int64
			seen := make(map[string]bool)
			for _, r := range got {
				partitions[r.partition]++
				w, ok := wants[string(r.key)]
				if !ok || seen[string(r.key)] {
					t.Fatalf("unexpected or duplicate key %q", r.key)
				}
				seen[string(r.key)] = true
				if w.poison {
					poison++
					checkPoison(t, tt.format, w.kind, r.value)
					continue
				}
				ev, err := decode(tt.format, r.value)
				if err != nil {
					t.Fatalf("record %s does not decode: %v", r.key, err)
				}
				wantEv, _ := decode(tt.format, w.value)
				if !validEvent(ev) || ev.Id != string(r.key) || !proto.Equal(ev, wantEv) {
					t.Fatalf("record %s = %v, want %v", r.key, ev, wantEv)
				}
			}
			if poison != wantPoison {
				t.Errorf("read %d poison records, generator made %d", poison, wantPoison)
			}
			if len(partitions) != 4 {
				t.Errorf("records landed on %d partitions, want 4", len(partitions))
			}
		})
	}
}

func TestRunUntilCancelled(t *testing.T) {
	_, addr := testenv.Kafka(t, 2, "events")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	stats, err := Run(ctx, Options{Brokers: []string{addr}, Topic: "events", Rate: 2000, Seed: 1}, quietLogger())
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if stats.Produced == 0 || stats.Failed != 0 {
		t.Fatalf("stats = %+v, want some produced and none failed", stats)
	}
	consume(t, addr, "events", int(stats.Produced))
}

func TestRunDeliveryFailure(t *testing.T) {
	// A port nobody listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stats, err := Run(ctx, Options{
		Brokers:    []string{addr},
		Topic:      "events",
		Count:      5,
		Properties: map[string]string{"message.timeout.ms": "300", "log_level": "0"},
	}, quietLogger())
	if err == nil {
		t.Fatal("Run succeeded without a broker")
	}
	if stats.Failed != 5 || stats.Produced != 0 {
		t.Errorf("stats = %+v, want 5 failed", stats)
	}
	if !strings.Contains(err.Error(), "5 of 5 records not delivered") {
		t.Errorf("error %q does not count the failures", err)
	}
}

func TestRunInvalidOptions(t *testing.T) {
	base := Options{Brokers: []string{"127.0.0.1:9092"}, Topic: "events"}
	tests := []struct {
		name   string
		modify func(*Options)
		want   string
	}{
		{"no brokers", func(o *Options) { o.Brokers = nil }, "brokers"},
		{"no topic", func(o *Options) { o.Topic = "" }, "topic"},
		{"negative rate", func(o *Options) { o.Rate = -1 }, "rate"},
		{"negative count", func(o *Options) { o.Count = -1 }, "count"},
		{"poison above one", func(o *Options) { o.PoisonFraction = 1.5 }, "poison fraction"},
		{"unknown format", func(o *Options) { o.Format = "avro" }, "format"},
		{"empty metric", func(o *Options) { o.Metrics = []string{""} }, "metric"},
		{"negative spread", func(o *Options) { o.TimeSpread = -time.Second }, "time spread"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := base
			tt.modify(&o)
			_, err := Run(context.Background(), o, quietLogger())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Run error = %v, want it to mention %q", err, tt.want)
			}
		})
	}
	t.Run("all problems at once", func(t *testing.T) {
		_, err := Run(context.Background(), Options{Rate: -1}, quietLogger())
		if err == nil || !strings.Contains(err.Error(), "brokers") || !strings.Contains(err.Error(), "topic") || !strings.Contains(err.Error(), "rate") {
			t.Errorf("Run error = %v, want brokers, topic and rate", err)
		}
	})
}
