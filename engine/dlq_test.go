package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/event"
	"ratchet/internal/produce"
	"ratchet/internal/testenv"
	"ratchet/processor"
)

// rawRecord is a record as produced, with where it landed.
type rawRecord struct {
	key, value []byte
	id         string // event id; empty for poison
	partition  int32
	offset     int64
}

// sendRaw produces records and fills in their partition and offset.
func (pr *producer) sendRaw(tb testing.TB, recs []*rawRecord) {
	tb.Helper()
	deliveries := make(chan kafka.Event, len(recs))
	t := topic
	for _, r := range recs {
		for {
			err := pr.p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &t, Partition: kafka.PartitionAny},
				Key: r.key, Value: r.value, Opaque: r}, deliveries)
			if err == nil {
				break
			}
			var ke kafka.Error
			if errors.As(err, &ke) && ke.Code() == kafka.ErrQueueFull {
				pr.p.Flush(100)
				continue
			}
			tb.Fatalf("produce: %v", err)
		}
	}
	for range recs {
		select {
		case d := <-deliveries:
			m := d.(*kafka.Message)
			if m.TopicPartition.Error != nil {
				tb.Fatalf("delivery: %v", m.TopicPartition.Error)
			}
			r := m.Opaque.(*rawRecord)
			r.partition, r.offset = m.TopicPartition.Partition, int64(m.TopicPartition.Offset)
		case <-time.After(60 * time.Second):
			tb.Fatal("deliveries did not arrive within 60s")
		}
	}
}

// generate makes n records with the demo generator, poison included.
func generate(n int, poison float64) []*rawRecord {
	g := produce.NewGenerator(produce.Options{Seed: 7, PoisonFraction: poison, Format: event.FormatProtobuf,
		Now: func() time.Time { return time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC) }, TimeSpread: time.Hour})
	out := make([]*rawRecord, n)
	for i := range out {
		k, v, ev, _ := g.Next()
		r := &rawRecord{key: k, value: v}
		if ev != nil {
			r.id = ev.Id
		}
		out[i] = r
	}
	return out
}

// dlqEntry is one record read back from the dead-letter topic.
type dlqEntry struct {
	partition int32
	offset    int64
	headers   map[string]string
	key       []byte
}

// readDLQ reads every record of the dead-letter topic once there are at
// least want of them.
func readDLQ(tb testing.TB, cluster *kfake.Cluster, addr, dlqTopic string, want int) []dlqEntry {
	tb.Helper()
	testenv.Eventually(tb, 90*time.Second, func() bool {
		var n int64
		for _, p := range cluster.PartitionInfos(dlqTopic) {
			n += p.HighWatermark
		}
		return n >= int64(want)
	}, "%d records in %s", want, dlqTopic)
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": addr, "group.id": "dlq-reader", "log_level": 3})
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	var parts []kafka.TopicPartition
	var total int64
	t := dlqTopic
	for _, p := range cluster.PartitionInfos(dlqTopic) {
		parts = append(parts, kafka.TopicPartition{Topic: &t, Partition: p.Partition, Offset: kafka.OffsetBeginning})
		total += p.HighWatermark
	}
	if err := c.Assign(parts); err != nil {
		tb.Fatal(err)
	}
	var out []dlqEntry
	deadline := time.Now().Add(60 * time.Second)
	for int64(len(out)) < total && time.Now().Before(deadline) {
		m, err := c.ReadMessage(time.Second)
		if err != nil {
			continue
		}
		e := dlqEntry{headers: map[string]string{}, key: m.Key}
		for _, h := range m.Headers {
			e.headers[h.Key] = string(h.Value)
		}
		e.partition = int32(atoi(tb, e.headers["ratchet.partition"]))
		e.offset = atoi(tb, e.headers["ratchet.offset"])
		out = append(out, e)
	}
	return out
}

func atoi(tb testing.TB, s string) int64 {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		tb.Fatalf("header %q: %v", s, err)
	}
	return v
}

// assertDLQHoldsExactly checks the dead-letter topic holds exactly the
// given records (by source partition and offset), each once, with every
// header.
func assertDLQHoldsExactly(tb testing.TB, got []dlqEntry, want []*rawRecord) {
	tb.Helper()
	type po struct {
		p int32
		o int64
	}
	wantSet := map[po]bool{}
	for _, r := range want {
		wantSet[po{r.partition, r.offset}] = true
	}
	seen := map[po]int{}
	for _, e := range got {
		k := po{e.partition, e.offset}
		seen[k]++
		if !wantSet[k] {
			tb.Errorf("DLQ holds %v, which is not a poison record", k)
		}
		for _, h := range []string{"ratchet.error", "ratchet.topic", "ratchet.partition", "ratchet.offset", "ratchet.attempts", "ratchet.failed_at"} {
			if e.headers[h] == "" {
				tb.Errorf("DLQ record %v lacks header %s", k, h)
			}
		}
	}
	for k := range wantSet {
		if seen[k] == 0 {
			tb.Errorf("poison record %v missing from the DLQ", k)
		}
	}
	if len(got) != len(seen) {
		tb.Logf("%d DLQ records for %d distinct poison records", len(got), len(seen))
	}
}

func TestPoisonGoesToTheDLQAndGoodRecordsApplyOnce(t *testing.T) {
	for _, mode := range []string{config.ModeExactlyOnce, config.ModeAtLeastOnce} {
		t.Run(mode, func(t *testing.T) {
			const n = 30_000
			cluster, addr := testenv.Kafka(t, 12, topic)
			dbURL := testenv.Postgres(t)
			pool := openPool(t, dbURL)
			createLedger(t, pool)
			recs := generate(n, 0.01)
			newProducer(t, addr).sendRaw(t, recs)
			var poison []*rawRecord
			good := 0
			for _, r := range recs {
				if r.id == "" {
					poison = append(poison, r)
				} else {
					good++
				}
			}
			cfg := testConfig(t, addr, dbURL, mode)
			r := start(t, cfg, ledger{"a"}, "a")
			waitApplied(t, pool, int64(good))
			got := readDLQ(t, cluster, addr, cfg.Kafka.DLQTopic(topic), len(poison))
			r.Stop(t)
			assertLedgerExactlyOnce(t, pool, int64(good))
			assertDLQHoldsExactly(t, got, poison)
			if mode == config.ModeExactlyOnce {
				if rows := count(t, pool, `SELECT count(*) FROM ratchet_dead_letters`); rows != int64(len(poison)) {
					t.Errorf("ratchet_dead_letters has %d rows, want %d", rows, len(poison))
				}
			}
		})
	}
}

// flaky fails chosen records: twice (then succeeds) or always.
type flaky struct {
	ledger
	mu       sync.Mutex
	failures map[string]int
	twice    string
	always   string
}

func (f *flaky) Process(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
	f.mu.Lock()
	for _, r := range b.Records {
		switch r.Event.Id {
		case f.twice:
			if f.failures[f.twice] < 2 {
				f.failures[f.twice]++
				f.mu.Unlock()
				return fmt.Errorf("downstream not ready for %s", r.Event.Id)
			}
		case f.always:
			f.failures[f.always]++
			f.mu.Unlock()
			return fmt.Errorf("cannot apply %s", r.Event.Id)
		}
	}
	f.mu.Unlock()
	return f.ledger.Process(ctx, tx, b)
}

func TestRetriesThenDeadLetterAfterMaxAttempts(t *testing.T) {
	const n = 3_000
	cluster, addr := testenv.Kafka(t, 12, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	recs := generate(n, 0)
	newProducer(t, addr).sendRaw(t, recs)
	f := &flaky{ledger: ledger{"a"}, failures: map[string]int{}, twice: recs[100].id, always: recs[200].id}
	cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
	cfg.Retry.InitialBackoff = 10 * time.Millisecond
	cfg.Retry.MaxBackoff = 50 * time.Millisecond
	r := start(t, cfg, f, "a")
	waitApplied(t, pool, n-1)
	got := readDLQ(t, cluster, addr, cfg.Kafka.DLQTopic(topic), 1)
	r.Stop(t)
	assertLedgerExactlyOnce(t, pool, n-1)
	assertDLQHoldsExactly(t, got, []*rawRecord{recs[200]})
	if got[0].headers["ratchet.attempts"] != strconv.Itoa(cfg.Retry.MaxAttempts) {
		t.Errorf("ratchet.attempts = %s, want %d", got[0].headers["ratchet.attempts"], cfg.Retry.MaxAttempts)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failures[f.twice] != 2 {
		t.Errorf("the twice-failing record failed %d times", f.failures[f.twice])
	}
}

func TestDLQUnavailableBlocksThePartition(t *testing.T) {
	const n = 5_000
	cluster, addr := testenv.Kafka(t, 4, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
	dlqTopic := cfg.Kafka.DLQTopic(topic)
	if err := cluster.CreateTopic(dlqTopic, 4, nil); err != nil {
		t.Fatal(err)
	}
	// Every produce to the DLQ topic fails until removed.
	fault := cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: dlqTopic,
		Err: kerr.NotEnoughReplicas, Count: -1})
	recs := generate(n, 0.01)
	newProducer(t, addr).sendRaw(t, recs)
	var poison []*rawRecord
	firstPoison := map[int32]int64{}
	for _, r := range recs {
		if r.id == "" {
			poison = append(poison, r)
			if o, ok := firstPoison[r.partition]; !ok || r.offset < o {
				firstPoison[r.partition] = r.offset
			}
		}
	}
	r := start(t, cfg, ledger{"a"}, "a")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := fault.Wait(ctx, 5); err != nil {
		t.Fatalf("the DLQ was never tried: %v", err)
	}
	// While the DLQ is down the stored offset never passes a poison record.
	outage := time.Now().Add(10 * time.Second)
	for time.Now().Before(outage) {
		rows, err := pool.Query(context.Background(), `SELECT partition, next_offset FROM ratchet_offsets`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var p int32
			var next int64
			if err := rows.Scan(&p, &next); err != nil {
				t.Fatal(err)
			}
			if fp, ok := firstPoison[p]; ok && next > fp {
				t.Fatalf("partition %d stored offset %d passed poison record %d while the DLQ was down", p, next, fp)
			}
		}
		rows.Close()
		time.Sleep(200 * time.Millisecond) // sampling interval of the invariant, not synchronisation
	}
	fault.Remove()
	waitApplied(t, pool, int64(n-len(poison)))
	got := readDLQ(t, cluster, addr, dlqTopic, len(poison))
	r.Stop(t)
	assertLedgerExactlyOnce(t, pool, int64(n-len(poison)))
	assertDLQHoldsExactly(t, got, poison)
}

// TestDeadLetterLogAccountsForEveryLetter: with the default
// log.dead_letters (summary), poison records are a few lines, not a line
// each: one in full per reason class and summaries, the last ones written
// at the stop, whose counts with the full lines add up to every record in
// the dead-letter topic.
func TestDeadLetterLogAccountsForEveryLetter(t *testing.T) {
	const n = 4_000
	cluster, addr := testenv.Kafka(t, 4, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	recs := generate(n, 0.05)
	newProducer(t, addr).sendRaw(t, recs)
	poison := 0
	for _, r := range recs {
		if r.id == "" {
			poison++
		}
	}
	cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
	if cfg.Log.DeadLetters != config.DeadLettersSummary {
		t.Fatalf("log.dead_letters defaults to %q, want summary", cfg.Log.DeadLetters)
	}
	var logs testenv.Buffer
	r := startWith(t, cfg, engine.Options{Processor: ledger{"a"}, Owner: "a"}, testenv.Log{To: &logs, JSON: true})
	waitApplied(t, pool, int64(n-poison))
	got := readDLQ(t, cluster, addr, cfg.Kafka.DLQTopic(topic), poison)
	r.Stop(t)

	full, summaries, accounted := 0, 0, 0
	for line := range strings.Lines(logs.String()) {
		var l struct {
			Msg    string `json:"msg"`
			Count  int    `json:"count"`
			Reason string `json:"reason"`
		}
		if json.Unmarshal([]byte(line), &l) != nil {
			continue
		}
		switch l.Msg {
		case "dead letter":
			full++
			accounted++
		case "dead letters":
			summaries++
			accounted += l.Count
		}
	}
	if accounted != len(got) {
		t.Errorf("the log accounts for %d dead letters (%d in full, %d summaries), the DLQ holds %d", accounted, full, summaries, len(got))
	}
	if full+summaries > 10 {
		t.Errorf("%d lines about %d dead letters, want a few per reason class", full+summaries, len(got))
	}
	t.Logf("%d dead letters: %d lines in full, %d summaries", len(got), full, summaries)
}
