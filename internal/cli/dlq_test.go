package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/actors"
	"ratchet/config"
	"ratchet/internal/store"
	"ratchet/internal/testenv"
)

// readAll reads every record of topic as it is now.
func readAll(tb testing.TB, o *opsEnv, topic string) []*kafka.Message {
	tb.Helper()
	k, err := openKafka(o.config(tb), "ratchet-test-reader")
	if err != nil {
		tb.Fatal(err)
	}
	defer k.Close()
	all, err := k.topics()
	if err != nil {
		tb.Fatal(err)
	}
	var out []*kafka.Message
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, p := range all[topic] {
		if _, err := k.readPartition(ctx, topic, p, 0, func(m *kafka.Message) error {
			out = append(out, m)
			return nil
		}); err != nil {
			tb.Fatal(err)
		}
	}
	return out
}

func header(m *kafka.Message, key string) (string, bool) {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// replayed returns the records of the source topic that carry
// ratchet.replayed_from, by its value.
func replayedRecords(tb testing.TB, o *opsEnv) map[string][]*kafka.Message {
	tb.Helper()
	out := map[string][]*kafka.Message{}
	for _, m := range readAll(tb, o, opsTopic) {
		if v, ok := header(m, HeaderReplayedFrom); ok {
			out[v] = append(out[v], m)
		}
	}
	return out
}

var countsRe = regexp.MustCompile(`(replayed|would replay) (\d+), skipped (\d+) already replayed, filtered out (\d+)`)

// replayCountsOf parses the summary line of `dlq replay`.
func replayCountsOf(tb testing.TB, out string) [3]int {
	tb.Helper()
	m := countsRe.FindStringSubmatch(out)
	if m == nil {
		tb.Fatalf("no summary line in:\n%s", out)
	}
	var n [3]int
	for i := range n {
		n[i], _ = strconv.Atoi(m[i+2])
	}
	return n
}

// TestReplayAfterAFixedConstraint: records refused by a CHECK constraint
// (a permanent database error) go to the DLQ with their headers and
// timestamp; after the constraint is fixed, a replay brings them back while
// the engine keeps running and each is applied exactly once; a second
// replay replays nothing.
func TestReplayAfterAFixedConstraint(t *testing.T) {
	cluster, addr := testenv.Kafka(t, 2, opsTopic, opsTopic+".dlq")
	o := newOpsEnv(t, addr, config.ModeExactlyOnce)
	ctx := context.Background()
	if _, err := o.pool.Exec(ctx, `ALTER TABLE test_ledger ADD CONSTRAINT val_not_negative CHECK (val >= 0)`); err != nil {
		t.Fatal(err)
	}
	cfg := o.config(t)
	eng := startEngine(t, cfg, newLedger("a"), "a")

	const n, bad = 100, 10
	ts := time.Date(2026, 12, 1, 8, 0, 0, 123_000_000, time.UTC)
	headers := []kafka.Header{{Key: "trace", Value: []byte("t-1")}, {Key: "origin", Value: []byte("test")}}
	produced, err := newKafkaProducer(t, addr).send(kafka.PartitionAny, n, func(i int) float64 {
		if i%(n/bad) == 0 {
			return -1
		}
		return 1
	}, headers, ts)
	if err != nil {
		t.Fatal(err)
	}
	dlqCount := func() int64 {
		var s int64
		for _, e := range ends(cluster, opsTopic+".dlq") {
			s += e
		}
		return s
	}
	waitCaughtUp(t, cluster, o, cfg.Kafka.GroupID)
	testenv.Eventually(t, 30*time.Second, func() bool { return dlqCount() == bad }, "%d dead letters (have %d)", bad, dlqCount())
	if got := o.count(t, `SELECT count(*) FROM test_ledger`); got != n-bad {
		t.Fatalf("%d records applied before the fix, want %d", got, n-bad)
	}

	// The page's dead-letters panel shows the reason, once, with the count.
	var page string
	select {
	case page = <-eng.Listening():
	case <-time.After(30 * time.Second):
		t.Fatal("the page does not listen")
	}
	resp, err := http.Get("http://" + page + "/api/state")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		DeadLetters []struct {
			Topic  string `json:"topic"`
			Reason string `json:"reason"`
			Count  int64  `json:"count"`
		} `json:"dead_letters"`
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.DeadLetters) != 1 || st.DeadLetters[0].Count != bad || !strings.Contains(st.DeadLetters[0].Reason, "val_not_negative") ||
		strings.HasPrefix(st.DeadLetters[0].Reason, "apply ") {
		t.Errorf("page dead letters %+v, want one reason with %d", st.DeadLetters, bad)
	}

	// The DLQ keeps the original headers first, then ratchet's, and the
	// original timestamp.
	for _, m := range readAll(t, o, opsTopic+".dlq") {
		var keys []string
		for _, h := range m.Headers {
			keys = append(keys, h.Key)
		}
		want := []string{"trace", "origin", actors.HeaderError, actors.HeaderTopic, actors.HeaderPartition,
			actors.HeaderOffset, actors.HeaderAttempts, actors.HeaderFailedAt, actors.HeaderReason, actors.HeaderSQLState}
		if strings.Join(keys, ",") != strings.Join(want, ",") {
			t.Errorf("dead letter headers %v, want %v", keys, want)
		}
		if !m.Timestamp.Equal(ts) {
			t.Errorf("dead letter timestamp %v, want the original %v", m.Timestamp, ts)
		}
	}

	out := o.mustRun(t, "dlq", "ls")
	t.Logf("dlq ls:\n%s", out)
	if !strings.Contains(out, fmt.Sprintf("events.dlq: %d dead letters", bad)) || !strings.Contains(out, "val_not_negative") {
		t.Errorf("dlq ls does not summarise the dead letters:\n%s", out)
	}
	sum := 0
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 5 && f[0] == opsTopic {
			c, _ := strconv.Atoi(f[4])
			sum += c
		}
	}
	if sum != bad {
		t.Errorf("dlq ls counts %d, want %d", sum, bad)
	}

	end := ends(cluster, opsTopic)
	out = o.mustRun(t, "dlq", "replay", "--reason", "val_not_negative")
	if got := replayCountsOf(t, out); got != [3]int{bad, 0, 0} || !strings.Contains(out, "dry run") {
		t.Errorf("dry run counts %v:\n%s", got, out)
	}
	if got := o.mustRun(t, "dlq", "replay", "--reason", "^nothing like it$"); replayCountsOf(t, got) != [3]int{0, 0, bad} {
		t.Errorf("a filter that matches nothing:\n%s", got)
	}
	if fmt.Sprint(ends(cluster, opsTopic)) != fmt.Sprint(end) {
		t.Fatalf("a dry run produced records")
	}

	if _, err := o.pool.Exec(ctx, `ALTER TABLE test_ledger DROP CONSTRAINT val_not_negative`); err != nil {
		t.Fatal(err)
	}
	out = o.mustRun(t, "dlq", "replay", "--reason", "val_not_negative", "--execute")
	if got := replayCountsOf(t, out); got != [3]int{bad, 0, 0} {
		t.Errorf("replay counts %v:\n%s", got, out)
	}
	waitCaughtUp(t, cluster, o, cfg.Kafka.GroupID)
	if got, distinct := o.count(t, `SELECT count(*) FROM test_ledger`), o.count(t, `SELECT count(DISTINCT id) FROM test_ledger`); got != n || distinct != n {
		t.Errorf("ledger holds %d rows of %d events after the replay, want %d of %d", got, distinct, n, n)
	}
	_ = produced

	// The replayed records are the originals: key, value, headers, timestamp.
	rep := replayedRecords(t, o)
	if len(rep) != bad {
		t.Fatalf("%d replayed records, want %d", len(rep), bad)
	}
	for from, ms := range rep {
		m := ms[0]
		if len(ms) != 1 {
			t.Errorf("%s replayed %d times", from, len(ms))
		}
		if v, _ := header(m, "trace"); v != "t-1" || len(m.Headers) != 4 || m.Headers[2].Key != HeaderReplayedFrom {
			t.Errorf("replayed record headers %v", m.Headers)
		}
		if g, _ := header(m, actors.HeaderReplayGroup); g != cfg.Kafka.GroupID {
			t.Errorf("replayed record headers %v", m.Headers)
		}
		if !m.Timestamp.Equal(ts) {
			t.Errorf("replayed record timestamp %v, want %v", m.Timestamp, ts)
		}
		if !strings.HasPrefix(from, opsTopic+".dlq/") {
			t.Errorf("%s = %q", HeaderReplayedFrom, from)
		}
	}

	out = o.mustRun(t, "dlq", "replay", "--execute")
	if got := replayCountsOf(t, out); got != [3]int{0, bad, 0} {
		t.Errorf("second replay counts %v, want nothing replayed:\n%s", got, out)
	}
	if len(replayedRecords(t, o)) != bad {
		t.Errorf("the second replay produced records")
	}
}

// TestReplayInterruptedAndRerunReplaysEachOnce stops a replay right after
// a delivery report, before it is recorded (where a kill hurts most), and
// runs it again: every dead letter ends up in the source topic exactly
// once.
func TestReplayInterruptedAndRerunReplaysEachOnce(t *testing.T) {
	_, addr := testenv.Kafka(t, 2, opsTopic, opsTopic+".dlq")
	o := newOpsEnv(t, addr, config.ModeExactlyOnce)
	cfg := o.config(t)

	// Dead letters as the DLQ actor writes them.
	const n = 40
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": addr, "log_level": 3})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dlq := opsTopic + ".dlq"
	failed := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	// Two more dead letters of records 0 and 1: the DLQ is at-least-once,
	// and each source record must be replayed once.
	const dups = 2
	deliveries := make(chan kafka.Event, n+dups)
	for j := range n + dups {
		i := j % n
		err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &dlq, Partition: int32(i % 2)},
			Key: []byte(fmt.Sprint("k", i)), Value: eventBytes(fmt.Sprint("dead-", i), 1), Headers: []kafka.Header{
				{Key: actors.HeaderError, Value: []byte("processor: permanent")},
				{Key: actors.HeaderTopic, Value: []byte(opsTopic)},
				{Key: actors.HeaderPartition, Value: []byte(strconv.Itoa(i % 2))},
				{Key: actors.HeaderOffset, Value: []byte(strconv.Itoa(i))},
				{Key: actors.HeaderAttempts, Value: []byte("1")},
				{Key: actors.HeaderFailedAt, Value: []byte(failed.Add(time.Duration(i) * time.Minute).Format(time.RFC3339Nano))},
			}}, deliveries)
		if err != nil {
			t.Fatal(err)
		}
	}
	for range n + dups {
		if m := (<-deliveries).(*kafka.Message); m.TopicPartition.Error != nil {
			t.Fatal(m.TopicPartition.Error)
		}
	}

	// The filters: --since/--until on ratchet.failed_at, --partitions on
	// the source partition.
	out := o.mustRun(t, "dlq", "replay", "--since", failed.Add(10*time.Minute).Format(time.RFC3339),
		"--until", failed.Add(20*time.Minute).Format(time.RFC3339), "--partitions", "1")
	if got := replayCountsOf(t, out); got != [3]int{5, 0, n + dups - 5} {
		t.Errorf("filtered dry run %v:\n%s", got, out)
	}

	// Chunks of 10; stop at the 15th delivery report: 14 recorded, the
	// rest of the second chunk delivered or on its way, unrecorded; the
	// last two chunks never produced.
	defer func(c int) { replayChunk = c }(replayChunk)
	replayChunk = 10
	reports := 0
	var first bytes.Buffer
	_, err = replay(context.Background(), &first, cfg, replayOptions{execute: true}, func() bool { reports++; return reports == 15 })
	if !errors.Is(err, errInterrupted) {
		t.Fatalf("interrupted run: %v\n%s", err, first.String())
	}
	delivered := len(replayedRecords(t, o))
	if delivered < 15 || delivered > 20 {
		t.Fatalf("the interrupted run delivered %d, want 15..20", delivered)
	}
	if done := o.count(t, `SELECT count(*) FROM ratchet_replays WHERE state = 'done'`); done != 14 {
		t.Fatalf("%d replays recorded as done by the interrupted run, want 14", done)
	}

	out = o.mustRun(t, "dlq", "replay", "--execute")
	t.Logf("interrupted run delivered %d; rerun:\n%s", delivered, lastLines(out, 3))
	if found := strings.Count(out, "by an interrupted run"); found != delivered-14 {
		t.Errorf("the rerun found %d records of the interrupted run, which delivered %d unrecorded", found, delivered-14)
	}
	if got := replayCountsOf(t, out); got != [3]int{n - delivered, delivered, 0} || !strings.Contains(out, "skipped 2 duplicate") {
		t.Errorf("rerun counts %v, want %d replayed, %d skipped and 2 duplicates:\n%s", got, n-delivered, delivered, lastLines(out, 2))
	}
	rep := replayedRecords(t, o)
	if len(rep) != n {
		t.Errorf("%d dead letters replayed, want %d", len(rep), n)
	}
	for from, ms := range rep {
		if len(ms) != 1 {
			t.Errorf("%s replayed %d times", from, len(ms))
		}
	}
	if done := o.count(t, `SELECT count(*) FROM ratchet_replays WHERE state = 'done'`); done != n {
		t.Errorf("%d replays recorded, want %d", done, n)
	}
	if got := replayCountsOf(t, o.mustRun(t, "dlq", "replay", "--execute")); got != [3]int{0, n, 0} {
		t.Errorf("third run %v, want nothing replayed", got)
	}

	// Two runs at once would both produce what neither has recorded: the
	// second refuses while the first holds the topic's lock.
	lease, err := store.LockReplays(context.Background(), o.pool, dlq, "test")
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := o.run(t, "dlq", "replay", "--execute")
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code != ExitError || !strings.Contains(errOut, "another replay") {
		t.Errorf("a concurrent run: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	if got := replayCountsOf(t, o.mustRun(t, "dlq", "replay", "--execute")); got != [3]int{0, n, 0} {
		t.Errorf("after the lock was released: %v", got)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
