package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/actors"
	"ratchet/config"
	"ratchet/internal/store"
	"ratchet/internal/testenv"
)

// dlqWriter produces dead letters as the DLQ actor writes them.
type dlqWriter struct {
	tb testing.TB
	p  *kafka.Producer
}

func newDLQWriter(tb testing.TB, addr string, extra kafka.ConfigMap) *dlqWriter {
	tb.Helper()
	m := kafka.ConfigMap{"bootstrap.servers": addr, "log_level": 3}
	for k, v := range extra {
		m[k] = v
	}
	p, err := kafka.NewProducer(&m)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return &dlqWriter{tb: tb, p: p}
}

// letter is one dead letter of source record opsTopic[srcPart] at srcOff.
type letter struct {
	dlqPart  int32
	srcPart  int32
	srcOff   int64
	failedAt time.Time
	id       string
}

func (l letter) message(topic string) *kafka.Message {
	return &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: l.dlqPart},
		Key: []byte(l.id), Value: eventBytes(l.id, 1), Headers: []kafka.Header{
			{Key: actors.HeaderError, Value: []byte("processor: permanent")},
			{Key: actors.HeaderTopic, Value: []byte(opsTopic)},
			{Key: actors.HeaderPartition, Value: []byte(strconv.Itoa(int(l.srcPart)))},
			{Key: actors.HeaderOffset, Value: []byte(strconv.FormatInt(l.srcOff, 10))},
			{Key: actors.HeaderAttempts, Value: []byte("1")},
			{Key: actors.HeaderFailedAt, Value: []byte(l.failedAt.Format(time.RFC3339Nano))},
		}}
}

// write produces letters to topic and waits for their delivery (or, in a
// transaction, for their acknowledgement by the broker).
func (w *dlqWriter) write(topic string, letters ...letter) {
	w.tb.Helper()
	deliveries := make(chan kafka.Event, len(letters))
	for _, l := range letters {
		if err := w.p.Produce(l.message(topic), deliveries); err != nil {
			w.tb.Fatal(err)
		}
	}
	for range letters {
		select {
		case ev := <-deliveries:
			if m := ev.(*kafka.Message); m.TopicPartition.Error != nil {
				w.tb.Fatal(m.TopicPartition.Error)
			}
		case <-time.After(30 * time.Second):
			w.tb.Fatal("no delivery report within 30s")
		}
	}
}

var fullCountsRe = regexp.MustCompile(`(?:replayed|would replay) (\d+), skipped (\d+) already replayed, filtered out (\d+)` +
	`(?:, skipped (\d+) duplicate dead letters?)?`)

// replayFigures parses the summary line of `dlq replay`: replayed, already,
// filtered, duplicates.
func replayFigures(tb testing.TB, out string) [4]int {
	tb.Helper()
	m := fullCountsRe.FindStringSubmatch(out)
	if m == nil {
		tb.Fatalf("no summary line in:\n%s", out)
	}
	var n [4]int
	for i := range n {
		n[i], _ = strconv.Atoi(m[i+1])
	}
	return n
}

// TestReplayNewDeadLetterOfAReplayedRecord: idempotency is keyed by the
// dead letter. A record replayed once that fails again (after an
// `offsets reset`) is a new dead letter and is replayed; two dead letters
// of one record seen in one run replay it once, and the other is recorded
// as a duplicate; a dead letter that a run from before migration 005
// skipped as a duplicate (it failed before that replay) stays skipped.
func TestReplayNewDeadLetterOfAReplayedRecord(t *testing.T) {
	_, addr := testenv.Kafka(t, 2, opsTopic, opsTopic+".dlq")
	o := newOpsEnv(t, addr, config.ModeExactlyOnce)
	dlq := opsTopic + ".dlq"
	w := newDLQWriter(t, addr, nil)
	t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)

	// Record 0/5 dead-lettered twice (the DLQ is at-least-once): replayed once.
	w.write(dlq, letter{dlqPart: 0, srcPart: 0, srcOff: 5, failedAt: t0, id: "a"},
		letter{dlqPart: 0, srcPart: 0, srcOff: 5, failedAt: t0.Add(time.Second), id: "a"})
	out := o.mustRun(t, "dlq", "replay", "--execute")
	if got := replayFigures(t, out); got != [4]int{1, 0, 0, 1} {
		t.Fatalf("first run %v, want 1 replayed and 1 duplicate:\n%s", got, out)
	}
	if got := replayFigures(t, o.mustRun(t, "dlq", "replay", "--execute")); got != [4]int{0, 1, 0, 1} {
		t.Fatalf("second run %v, want nothing replayed", got)
	}

	// After an offsets reset the replayed record fails again: a new dead
	// letter of the same source offset, replayed.
	w.write(dlq, letter{dlqPart: 1, srcPart: 0, srcOff: 5, failedAt: t0.Add(time.Hour), id: "a"})
	dry := o.mustRun(t, "dlq", "replay")
	if got := replayFigures(t, dry); got != [4]int{1, 1, 0, 1} || !strings.Contains(dry, "would replay "+dlq+"/1/0") {
		t.Fatalf("dry run after the new failure %v:\n%s", got, dry)
	}
	out = o.mustRun(t, "dlq", "replay", "--execute")
	if got := replayFigures(t, out); got != [4]int{1, 1, 0, 1} {
		t.Fatalf("run after the new failure %v, want the new dead letter replayed:\n%s", got, out)
	}
	if rep := replayedRecords(t, o); len(rep) != 2 || len(rep[dlq+"/0/0"]) != 1 || len(rep[dlq+"/1/0"]) != 1 {
		t.Fatalf("replayed records %v, want %s/0/0 and %s/1/0 once each", rep, dlq, dlq)
	}

	// A row written before migration 005 (legacy): its run replayed 1/7 at
	// t0+2h and skipped, unrecorded, a duplicate that failed before then.
	// A dead letter of 1/7 that failed after it is new.
	w.write(dlq, letter{dlqPart: 0, srcPart: 1, srcOff: 7, failedAt: t0, id: "b"},
		letter{dlqPart: 0, srcPart: 1, srcOff: 7, failedAt: t0.Add(time.Minute), id: "b"},
		letter{dlqPart: 0, srcPart: 1, srcOff: 7, failedAt: t0.Add(3 * time.Hour), id: "b"})
	if _, err := o.pool.Exec(context.Background(), `INSERT INTO ratchet_replays (dlq_topic, dlq_partition, dlq_offset, topic,
partition, source_offset, to_topic, to_partition, state, search_from, replayed_offset, updated_at, legacy)
VALUES ($1, 0, 2, $2, 1, 7, $2, 1, 'done', 0, 0, $3, true)`, dlq, opsTopic, t0.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	out = o.mustRun(t, "dlq", "replay", "--execute")
	if got := replayFigures(t, out); got != [4]int{1, 3, 0, 2} || !strings.Contains(out, "replayed "+dlq+"/0/4 ") {
		t.Fatalf("run with a legacy row %v, want only %s/0/4 replayed:\n%s", got, dlq, out)
	}
	if n := o.count(t, `SELECT count(*) FROM ratchet_replays WHERE state = 'duplicate'`); n != 2 {
		t.Errorf("%d duplicates recorded, want 2", n)
	}
}

// TestReplayReadsByPosition: the dead-letter topic holds transactions: a
// partition that ends in a commit marker, an aborted transaction (offsets
// without records), and an open transaction with dead letters after it.
// The dry run and the replay end at once (no wait for offsets that never
// come), read everything readable, say what is held back, and a later run
// replays what the open transaction held back once it commits. A pending
// replay whose record may be behind an open transaction in its source
// partition stays pending (exit 1) until it can be searched.
func TestReplayReadsByPosition(t *testing.T) {
	cluster, addr := testenv.Kafka(t, 3, opsTopic, opsTopic+".dlq")
	o := newOpsEnv(t, addr, config.ModeExactlyOnce)
	dlq := opsTopic + ".dlq"
	t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l := func(dlqPart int32, off int64) letter {
		return letter{dlqPart: dlqPart, srcPart: dlqPart, srcOff: off, failedAt: t0.Add(time.Duration(off) * time.Minute),
			id: fmt.Sprint("d", dlqPart, "-", off)}
	}
	plain := newDLQWriter(t, addr, nil)
	txn := func(id string) *dlqWriter {
		w := newDLQWriter(t, addr, kafka.ConfigMap{"transactional.id": id})
		if err := w.p.InitTransactions(ctx); err != nil {
			t.Fatal(err)
		}
		if err := w.p.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		return w
	}
	// Partition 0: a plain dead letter, then a committed transaction: the
	// last offset is the commit marker.
	plain.write(dlq, l(0, 1))
	c := txn("commit")
	c.write(dlq, l(0, 2))
	if err := c.p.CommitTransaction(ctx); err != nil {
		t.Fatal(err)
	}
	// Partition 1: an aborted transaction, then a plain dead letter.
	a := txn("abort")
	a.write(dlq, l(1, 1))
	if err := a.p.AbortTransaction(ctx); err != nil {
		t.Fatal(err)
	}
	plain.write(dlq, l(1, 2))
	// Partition 2: a plain dead letter, an open transaction, and a plain
	// dead letter after it.
	plain.write(dlq, l(2, 1))
	open := txn("open")
	open.write(dlq, l(2, 2))
	plain.write(dlq, l(2, 3))

	start := time.Now()
	dry := o.mustRun(t, "dlq", "replay")
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("the dry run took %v", took)
	}
	if got := replayFigures(t, dry); got != [4]int{4, 0, 0, 0} ||
		!strings.Contains(dry, dlq+"[2]: offsets 1..") || !strings.Contains(dry, "open transaction") {
		t.Fatalf("dry run %v, want 4 (0/1, 0/2, 1/2, 2/1) and a note on partition 2:\n%s", got, dry)
	}
	out := o.mustRun(t, "dlq", "replay", "--execute")
	if got := replayFigures(t, out); got != [4]int{4, 0, 0, 0} {
		t.Fatalf("replay %v:\n%s", got, out)
	}
	ls := o.mustRun(t, "dlq", "ls")
	if !strings.Contains(ls, dlq+": 4 dead letters") {
		t.Errorf("dlq ls (the aborted one is not a dead letter, the open one not readable yet):\n%s", ls)
	}

	// The open transaction commits: its dead letter and the one after it
	// are replayed; nothing is replayed twice.
	if err := open.p.CommitTransaction(ctx); err != nil {
		t.Fatal(err)
	}
	out = o.mustRun(t, "dlq", "replay", "--execute")
	if got := replayFigures(t, out); got != [4]int{2, 4, 0, 0} {
		t.Fatalf("replay after the commit %v, want 2 more:\n%s", got, out)
	}
	rep := replayedRecords(t, o)
	if len(rep) != 6 {
		t.Errorf("%d dead letters replayed, want 6: %v", len(rep), rep)
	}
	for from, ms := range rep {
		if len(ms) != 1 {
			t.Errorf("%s replayed %d times", from, len(ms))
		}
	}

	// A pending replay (produced by a run killed before its delivery was
	// recorded, as far as the rows know) to source partition 1, where an
	// open transaction now holds offsets back: the replay may be behind
	// it, so it stays pending and is not produced again.
	at := ends(cluster, dlq)[1]
	plain.write(dlq, l(1, 9))
	src := txn("open-source")
	src.write(opsTopic, letter{dlqPart: 1, srcPart: 1, srcOff: 0, failedAt: t0, id: "upstream"})
	if _, err := o.pool.Exec(ctx, `INSERT INTO ratchet_replays (dlq_topic, dlq_partition, dlq_offset, topic, partition,
source_offset, to_topic, to_partition, state, search_from) VALUES ($1, 1, $3, $2, 1, 9, $2, 1, 'pending', 0)`, dlq, opsTopic, at); err != nil {
		t.Fatal(err)
	}
	where := fmt.Sprintf("%s/1/%d", dlq, at)
	code, out, errOut := o.run(t, "dlq", "replay", "--execute")
	if code != ExitError || !strings.Contains(out, "left "+where+" pending: its replay may be in events[1] past offsets not readable yet") ||
		!strings.Contains(errOut, "pending") {
		t.Fatalf("a pending replay behind an open transaction: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if n := len(replayedRecords(t, o)[where]); n != 0 {
		t.Fatalf("the pending replay was produced again while it could not be searched")
	}
	// Once the transaction ends, the search reaches the end: not there,
	// so it was never delivered, and it is replayed once.
	if err := src.p.AbortTransaction(ctx); err != nil {
		t.Fatal(err)
	}
	out = o.mustRun(t, "dlq", "replay", "--execute")
	if !strings.Contains(out, "1 not delivered (replayed again)") || len(replayedRecords(t, o)[where]) != 1 {
		t.Fatalf("after the transaction ended:\n%s", out)
	}
}

// TestReplayForAnotherGroup: a replayed record carries the group it is for;
// an engine of another group skips it (not applied, not dead-lettered,
// its offset passed) and counts it in ratchet_replays_skipped_total; its
// own group's replays and records without the header are applied.
// --to-topic replays into a topic of one's own.
func TestReplayForAnotherGroup(t *testing.T) {
	cluster, addr := testenv.Kafka(t, 2, opsTopic, opsTopic+".dlq", "mine")
	o := newOpsEnv(t, addr, config.ModeExactlyOnce)
	cfg := o.config(t)
	eng := startEngine(t, cfg, newLedger("a"), "a")
	kp := newKafkaProducer(t, addr)
	for _, h := range [][]kafka.Header{
		nil,
		{{Key: HeaderReplayedFrom, Value: []byte("events.dlq/0/0")}, {Key: actors.HeaderReplayGroup, Value: []byte("another-group")}},
		{{Key: HeaderReplayedFrom, Value: []byte("events.dlq/0/1")}, {Key: actors.HeaderReplayGroup, Value: []byte(cfg.Kafka.GroupID)}},
		{{Key: HeaderReplayedFrom, Value: []byte("events.dlq/0/2")}, {Key: actors.HeaderReplayGroup, Value: []byte("another-group")}},
	} {
		if _, err := kp.send(0, 1, positive, h, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	waitCaughtUp(t, cluster, o, cfg.Kafka.GroupID)
	if got := o.count(t, `SELECT count(*) FROM test_ledger`); got != 2 {
		t.Errorf("%d records applied, want 2 (the plain one and the own group's replay)", got)
	}
	if got := o.count(t, `SELECT count(*) FROM test_ledger WHERE off IN (1, 3)`); got != 0 {
		t.Errorf("a replay for another group was applied")
	}
	if got := o.count(t, `SELECT count(*) FROM ratchet_dead_letters`); got != 0 {
		t.Errorf("%d dead letters, want none", got)
	}
	page := eng.Addr(t, 30*time.Second)
	metric := func() string {
		resp, err := http.Get("http://" + page + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return regexp.MustCompile(`(?m)^ratchet_replays_skipped_total\{topic="events"\} \d+`).FindString(string(b))
	}
	if got := metric(); got != `ratchet_replays_skipped_total{topic="events"} 2` {
		t.Errorf("metric %q, want 2 skipped", got)
	}

	// --to-topic: into a topic of one's own, same partition number.
	w := newDLQWriter(t, addr, nil)
	w.write(opsTopic+".dlq", letter{dlqPart: 1, srcPart: 1, srcOff: 3, failedAt: time.Now().UTC(), id: "x"})
	out := o.mustRun(t, "dlq", "replay", "--to-topic", "mine", "--execute")
	if got := replayFigures(t, out); got != [4]int{1, 0, 0, 0} || !strings.Contains(out, "to mine[1]") {
		t.Fatalf("--to-topic run %v:\n%s", got, out)
	}
	ms := readAll(t, o, "mine")
	if len(ms) != 1 {
		t.Fatalf("%d records in mine, want 1", len(ms))
	}
	if g, _ := header(ms[0], actors.HeaderReplayGroup); g != cfg.Kafka.GroupID {
		t.Errorf("replay group header %q", g)
	}
	if code, _, errOut := o.run(t, "dlq", "replay", "--to-topic", "nope", "--execute"); code != ExitConfig || !strings.Contains(errOut, "nope") {
		t.Errorf("--to-topic of a missing topic: exit %d, %s", code, errOut)
	}
}

// TestReplayDryRunIsTheExecutePlan: after an interrupted run (records
// delivered but not recorded, a pending row whose record never went out)
// and with duplicates in the dead-letter topic, a dry run reports exactly
// what --execute then does: the same counts, the same pending rows found
// delivered and not, and writes nothing. The execute resolves every
// pending row: each dead letter ends up in the source topic exactly once.
func TestReplayDryRunIsTheExecutePlan(t *testing.T) {
	cluster, addr := testenv.Kafka(t, 2, opsTopic, opsTopic+".dlq")
	o := newOpsEnv(t, addr, config.ModeExactlyOnce)
	cfg := o.config(t)
	dlq := opsTopic + ".dlq"
	t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	w := newDLQWriter(t, addr, nil)
	const n = 30
	var ls []letter
	for i := range n {
		ls = append(ls, letter{dlqPart: int32(i % 2), srcPart: int32(i % 2), srcOff: int64(i), failedAt: t0.Add(time.Duration(i) * time.Minute),
			id: fmt.Sprint("r", i)})
	}
	// Two duplicates (same source record, written again).
	ls = append(ls, letter{dlqPart: 0, srcPart: 0, srcOff: 0, failedAt: t0.Add(time.Hour), id: "r0"},
		letter{dlqPart: 1, srcPart: 1, srcOff: 1, failedAt: t0.Add(time.Hour), id: "r1"})
	w.write(dlq, ls...)

	defer func(c int) { replayChunk = c }(replayChunk)
	replayChunk = 10
	reports := 0
	var first strings.Builder
	if _, err := replay(context.Background(), &first, cfg, replayOptions{execute: true},
		func() bool { reports++; return reports == 5 }); err == nil {
		t.Fatalf("the interrupted run did not stop:\n%s", first.String())
	}
	// One more pending row whose record never went out: the last dead
	// letter of record 1/29 (events.dlq/1/14, in a chunk the interrupted
	// run never reached) is recorded pending from the current end.
	end := ends(cluster, opsTopic)[1]
	if _, err := o.pool.Exec(context.Background(), `INSERT INTO ratchet_replays (dlq_topic, dlq_partition, dlq_offset, topic,
partition, source_offset, to_topic, to_partition, state, search_from) VALUES ($1, 1, 14, $2, 1, 29, $2, 1, 'pending', $3)`,
		dlq, opsTopic, end); err != nil {
		t.Fatal(err)
	}
	snapshot := func() string {
		rows, err := o.pool.Query(context.Background(), `SELECT dlq_partition, dlq_offset, state FROM ratchet_replays ORDER BY 1, 2`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var b strings.Builder
		for rows.Next() {
			var p int32
			var off int64
			var st string
			if err := rows.Scan(&p, &off, &st); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "%d/%d %s;", p, off, st)
		}
		return b.String() + fmt.Sprint(ends(cluster, opsTopic))
	}
	before := snapshot()
	dry := o.mustRun(t, "dlq", "replay")
	if after := snapshot(); after != before {
		t.Fatalf("the dry run wrote something:\nbefore %s\nafter  %s", before, after)
	}
	exec := o.mustRun(t, "dlq", "replay", "--execute")
	summary := func(out string) string {
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "already replayed") {
				return strings.Replace(line, "would replay", "replayed", 1)
			}
		}
		t.Fatalf("no summary in:\n%s", out)
		return ""
	}
	t.Logf("dry run:  %s\nexecute: %s", summary(dry), summary(exec))
	if summary(dry) != summary(exec) {
		t.Errorf("the dry run's plan differs from what --execute did:\ndry run: %s\nexecute: %s", summary(dry), summary(exec))
	}
	if !strings.Contains(exec, "pending from an interrupted run") || !strings.Contains(exec, " 1 not delivered") {
		t.Errorf("the execute did not resolve the pending rows:\n%s", exec)
	}
	if strings.Count(dry, "by an interrupted run") != strings.Count(exec, "by an interrupted run") {
		t.Errorf("the dry run and the execute found different records of the interrupted run")
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
	if got := o.count(t, `SELECT count(*) FROM ratchet_replays WHERE state = 'pending'`); got != 0 {
		t.Errorf("%d rows left pending", got)
	}
	if got := replayFigures(t, o.mustRun(t, "dlq", "replay", "--execute")); got != [4]int{0, n, 0, 2} {
		t.Errorf("a rerun %v, want nothing to do", got)
	}
}

// TestReplayThroughPgBouncer: behind PgBouncer in transaction mode, with
// the URL a user would write, `dlq replay --execute` runs twice in a row
// (the second finds nothing to do: the first left no lock behind on a
// server session), and two runs at once exclude each other: while one
// holds the lease, the other is refused; run together, each dead letter
// is replayed once. Nothing mentions a prepared statement.
func TestReplayThroughPgBouncer(t *testing.T) {
	_, addr := testenv.Kafka(t, 2, opsTopic, opsTopic+".dlq")
	o := newOpsEnv(t, addr, config.ModeExactlyOnce)
	bouncer := testenv.StartPgBouncer(t, o.db, testenv.PgBouncerOptions{PoolSize: 2})
	o.db = bouncer.URL()
	cfg := o.config(t)
	dlq := opsTopic + ".dlq"
	w := newDLQWriter(t, addr, nil)
	t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	batch := func(from, n int) {
		var ls []letter
		for i := from; i < from+n; i++ {
			ls = append(ls, letter{dlqPart: int32(i % 2), srcPart: int32(i % 2), srcOff: int64(i), failedAt: t0.Add(time.Duration(i) * time.Second),
				id: fmt.Sprint("p", i)})
		}
		w.write(dlq, ls...)
	}
	var outputs strings.Builder
	batch(0, 20)
	out := o.mustRun(t, "dlq", "replay", "--execute")
	outputs.WriteString(out)
	if got := replayFigures(t, out); got != [4]int{20, 0, 0, 0} {
		t.Fatalf("first run %v:\n%s", got, out)
	}
	out = o.mustRun(t, "dlq", "replay", "--execute")
	outputs.WriteString(out)
	if got := replayFigures(t, out); got != [4]int{0, 20, 0, 0} {
		t.Fatalf("second run in a row %v:\n%s", got, out)
	}

	// While one run holds the lease (stopped at its first delivery
	// report), another is refused.
	batch(20, 10)
	var code int
	var second, secondErr string
	asked := false
	var first strings.Builder
	_, err := replay(context.Background(), &first, cfg, replayOptions{execute: true}, func() bool {
		if !asked {
			asked = true
			code, second, secondErr = o.run(t, "dlq", "replay", "--execute")
		}
		return false
	})
	outputs.WriteString(first.String() + second + secondErr)
	if err != nil {
		t.Fatalf("the run holding the lease: %v\n%s", err, first.String())
	}
	if code != ExitError || !strings.Contains(secondErr, "another replay of this dead-letter topic is running") {
		t.Fatalf("a run while another holds the lease: exit %d\nstdout:\n%s\nstderr:\n%s", code, second, secondErr)
	}

	// Two at once, as two operators would: each dead letter once.
	batch(30, 10)
	type result struct {
		code     int
		out, err string
	}
	results := make(chan result, 2)
	for range 2 {
		go func() {
			c, out, errOut := o.run(t, "dlq", "replay", "--execute")
			results <- result{c, out, errOut}
		}()
	}
	for range 2 {
		r := <-results
		outputs.WriteString(r.out + r.err)
		if r.code != ExitOK && !strings.Contains(r.err, "another replay") {
			t.Errorf("a concurrent run: exit %d\n%s\n%s", r.code, r.out, r.err)
		}
	}
	out = o.mustRun(t, "dlq", "replay", "--execute")
	outputs.WriteString(out)
	if got := replayFigures(t, out); got != [4]int{0, 40, 0, 0} {
		t.Errorf("after the concurrent runs %v, want all 40 replayed already", got)
	}
	rep := replayedRecords(t, o)
	if len(rep) != 40 {
		t.Errorf("%d dead letters replayed, want 40", len(rep))
	}
	for from, ms := range rep {
		if len(ms) != 1 {
			t.Errorf("%s replayed %d times", from, len(ms))
		}
	}
	if strings.Contains(strings.ToLower(outputs.String()), "prepared statement") {
		t.Errorf("the output mentions a prepared statement:\n%s", outputs.String())
	}
}

// replayHelperEnv, set, makes TestReplayHelperProcess a `dlq replay
// --execute` that stops for good after its first delivery report (before
// recording it) and says so on stdout, to be killed there.
const replayHelperEnv = "RATCHET_TEST_REPLAY_HELPER"

// TestReplayHelperProcess is not a test: TestReplayKilledWithSIGKILL runs
// the test binary with replayHelperEnv set, and this is what it runs.
func TestReplayHelperProcess(t *testing.T) {
	if os.Getenv(replayHelperEnv) == "" {
		t.Skip("run by TestReplayKilledWithSIGKILL")
	}
	ttl, err := time.ParseDuration(os.Getenv(replayHelperEnv))
	if err != nil {
		t.Fatal(err)
	}
	store.ReplayLeaseTTL = ttl
	cfg, err := config.Load("", os.Environ())
	if err != nil {
		t.Fatal(err)
	}
	_, err = replay(context.Background(), io.Discard, cfg, replayOptions{execute: true}, func() bool {
		fmt.Println("delivered")
		select {} // until killed
	})
	t.Fatalf("the helper replay ended: %v", err)
}

// TestReplayKilledWithSIGKILL: a replay killed with -9 between a delivery
// report and its record, behind PgBouncer in transaction mode, leaves its
// lease to expire: the next run is refused while it lasts and runs once it
// has expired, resolving the killed run's pending rows; each dead letter
// ends up in the source topic once.
func TestReplayKilledWithSIGKILL(t *testing.T) {
	_, addr := testenv.Kafka(t, 2, opsTopic, opsTopic+".dlq")
	o := newOpsEnv(t, addr, config.ModeExactlyOnce)
	bouncer := testenv.StartPgBouncer(t, o.db, testenv.PgBouncerOptions{PoolSize: 2})
	o.db = bouncer.URL()
	dlq := opsTopic + ".dlq"
	t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	var ls []letter
	for i := range 20 {
		ls = append(ls, letter{dlqPart: int32(i % 2), srcPart: int32(i % 2), srcOff: int64(i), failedAt: t0.Add(time.Duration(i) * time.Second),
			id: fmt.Sprint("k", i)})
	}
	newDLQWriter(t, addr, nil).write(dlq, ls...)

	const ttl = 5 * time.Second
	cmd := exec.Command(os.Args[0], "-test.run=^TestReplayHelperProcess$", "-test.v")
	cmd.Env = append(append(os.Environ(), o.environ()...), replayHelperEnv+"="+ttl.String())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var helperErr testenv.Buffer
	cmd.Stderr = &helperErr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ready := make(chan struct{})
	go func() { // ends when the helper's stdout closes (it is killed)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "delivered" {
				close(ready)
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case <-ready:
	case <-time.After(90 * time.Second):
		t.Fatalf("the helper replay did not deliver anything:\n%s", helperErr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed := time.Now()

	code, out, errOut := o.run(t, "dlq", "replay", "--execute")
	if code != ExitError || !strings.Contains(errOut, "another replay of this dead-letter topic is running") {
		t.Fatalf("a run right after the kill: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		code, out, errOut = o.run(t, "dlq", "replay", "--execute")
		return code == ExitOK
	}, "a run succeeds once the killed run's lease expired (last: exit %d, %s)", code, errOut)
	t.Logf("the next run went through %v after the kill (lease %v):\n%s", time.Since(killed).Round(100*time.Millisecond), ttl, lastLines(out, 1))
	if !strings.Contains(out, "pending from an interrupted run") {
		t.Errorf("the run after the kill found no pending rows:\n%s", out)
	}
	rep := replayedRecords(t, o)
	if len(rep) != 20 {
		t.Errorf("%d dead letters replayed, want 20", len(rep))
	}
	for from, ms := range rep {
		if len(ms) != 1 {
			t.Errorf("%s replayed %d times", from, len(ms))
		}
	}
	if got := o.count(t, `SELECT count(*) FROM ratchet_replays WHERE state = 'done'`); got != 20 {
		t.Errorf("%d replays recorded done, want 20", got)
	}
}
