package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"ratchet/internal/event"
	"ratchet/internal/metrics"
	"ratchet/internal/testenv"
	"ratchet/processor"
)

var clockStart = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func newTestDeadLetterLog(mode string) (*DeadLetterLog, *testenv.LogRecorder, *testenv.FakeClock) {
	rec := testenv.NewLogRecorder(slog.LevelDebug)
	clock := testenv.NewFakeClock(clockStart)
	l := NewDeadLetterLog(DeadLetterLogConfig{Mode: mode, Interval: 30 * time.Second, Logger: rec.Logger(), Clock: clock})
	return l, rec, clock
}

// decodeLetter is a record of topic/partition at offset that did not
// decode as JSON, in a batch starting at first.
func decodeLetter(topic string, partition int32, offset, first int64) Letter {
	return Letter{
		Record:     processor.Record{Topic: topic, Partition: partition, Offset: offset},
		Reason:     &event.Error{Kind: event.KindDecode, Format: event.FormatJSON, Reason: fmt.Sprintf("unexpected token at byte %d", offset%7)},
		Attempts:   1,
		batchStart: first,
		decoding:   true,
	}
}

// TestDeadLetterLogSummarises: the first dead letter of a (topic, reason
// class) is written in full, the others of the interval are one summary
// line with their count and each partition's offset range, and another
// class or topic has lines of its own.
func TestDeadLetterLogSummarises(t *testing.T) {
	l, rec, clock := newTestDeadLetterLog(DeadLetterLogSummary)

	l.Record(nil, []Letter{decodeLetter("events", 3, 120, 100)})
	full := rec.Lines("dead letter")
	if len(full) != 1 {
		t.Fatalf("%d full lines after the first dead letter, want 1", len(full))
	}
	want := map[string]any{"topic": "events", "partition": int64(3), "offset": int64(120), "first_offset": int64(100),
		"reason": "decode", "attempts": int64(1), "err": "decode json: unexpected token at byte 1", "actor": "dlq"}
	for k, v := range want {
		if got := full[0].Attrs[k]; got != v {
			t.Errorf("full line %s = %v (%T), want %v", k, got, got, v)
		}
	}
	if full[0].Level != slog.LevelWarn {
		t.Errorf("full line at %v, want WARN", full[0].Level)
	}

	// The same class, other partitions and offsets: counted, not written.
	var batch []Letter
	for off := int64(121); off < 131; off++ {
		batch = append(batch, decodeLetter("events", 3, off, 120))
	}
	batch = append(batch, decodeLetter("events", 5, 77, 70), decodeLetter("events", 5, 300, 290))
	l.Record(nil, batch)
	clock.Advance(29 * time.Second)
	l.Record(nil, []Letter{decodeLetter("events", 3, 90, 90)})
	if n := len(rec.Lines("")); n != 1 {
		t.Fatalf("%d lines before the interval passed, want only the first", n)
	}

	// Another reason class and another topic are classes of their own.
	invalid := Letter{Record: processor.Record{Topic: "events", Partition: 3, Offset: 131},
		Reason: &event.Error{Kind: event.KindInvalid, Reason: "metric is empty"}, Attempts: 1, batchStart: 131}
	l.Record(nil, []Letter{invalid, decodeLetter("clicks", 0, 5, 5)})
	if full = rec.Lines("dead letter"); len(full) != 3 {
		t.Fatalf("%d full lines, want 3 (one per class)", len(full))
	}
	if full[1].Attrs["reason"] != "invalid_event" || full[2].Attrs["topic"] != "clicks" {
		t.Errorf("full lines %v, %v", full[1].Attrs, full[2].Attrs)
	}

	clock.Advance(time.Second) // 30 s after the first line
	l.Record(nil, []Letter{decodeLetter("events", 5, 301, 301)})
	sums := rec.Lines("dead letters")
	if len(sums) != 1 {
		t.Fatalf("%d summary lines once the interval passed, want 1: %v", len(sums), rec.Lines(""))
	}
	s := sums[0].Attrs
	wantSum := map[string]any{"topic": "events", "reason": "decode", "count": int64(14), "partitions": int64(2),
		"offsets.3": "90..130", "offsets.5": "77..301", "actor": "dlq",
		"since": clockStart.Format(time.RFC3339Nano), "window": "30s"}
	for k, v := range wantSum {
		if got := s[k]; got != v {
			t.Errorf("summary %s = %v (%T), want %v", k, got, got, v)
		}
	}
	if sums[0].Level != slog.LevelWarn {
		t.Errorf("summary at %v, want WARN", sums[0].Level)
	}

	// Close writes what is still counted: nothing of events/decode json
	// (just summarised), nothing of the classes written in full once.
	l.Close()
	if n := len(rec.Lines("dead letters")); n != 1 {
		t.Errorf("%d summary lines after Close, want still 1", n)
	}
}

// TestDeadLetterLogTenThousand: 10,000 dead letters of one reason over
// three intervals are five lines: the first in full, one summary per
// interval, the rest at Close, and the summaries' counts add up to every
// letter.
func TestDeadLetterLogTenThousand(t *testing.T) {
	l, rec, clock := newTestDeadLetterLog(DeadLetterLogSummary)
	const n = 10000
	step := 90 * time.Second / n // 9 ms: the letters span three intervals
	for off := range int64(n) {
		l.Record(nil, []Letter{decodeLetter("events", int32(off%4), off, off)})
		clock.Advance(step)
	}
	l.Close()
	lines := rec.Lines("")
	if len(lines) > 1+3+1 {
		t.Fatalf("%d lines for %d dead letters over 3 intervals, want at most 5", len(lines), n)
	}
	if lines[0].Msg != "dead letter" {
		t.Fatalf("first line %q, want the first dead letter in full", lines[0].Msg)
	}
	total := int64(1)
	for _, s := range lines[1:] {
		if s.Msg != "dead letters" {
			t.Fatalf("line %q after the first, want only summaries", s.Msg)
		}
		total += s.Attrs["count"].(int64)
		if s.Attrs["partitions"] != int64(4) {
			t.Errorf("summary %v, want the 4 partitions' ranges", s.Attrs)
		}
	}
	if total != n {
		t.Errorf("the log accounts for %d dead letters, want %d", total, n)
	}
	if len(lines) < 4 {
		t.Errorf("%d lines, want a summary per interval (at least 4 lines)", len(lines))
	}
	t.Logf("%d dead letters over 3 intervals: %d lines", n, len(lines))
}

// TestDeadLetterLogCloseWritesPending: a count not yet due is written at
// Close, and a letter after Close is written in full at once.
func TestDeadLetterLogCloseWritesPending(t *testing.T) {
	l, rec, clock := newTestDeadLetterLog(DeadLetterLogSummary)
	l.Record(nil, []Letter{decodeLetter("events", 0, 1, 0), decodeLetter("events", 0, 2, 0), decodeLetter("events", 0, 7, 0)})
	clock.Advance(5 * time.Second)
	l.Close()
	sums := rec.Lines("dead letters")
	if len(sums) != 1 || sums[0].Attrs["count"] != int64(2) || sums[0].Attrs["offsets.0"] != "2..7" || sums[0].Attrs["window"] != "5s" {
		t.Fatalf("after Close: %v, want one summary of 2 dead letters at 2..7 over 5s", sums)
	}
	l.Record(nil, []Letter{decodeLetter("events", 0, 8, 8)})
	if full := rec.Lines("dead letter"); len(full) != 2 || full[1].Attrs["offset"] != int64(8) {
		t.Errorf("a dead letter after Close: %v, want it in full", full)
	}
}

// TestDeadLetterLogQuietClassStartsOver: after an interval with no dead
// letter of a class, its next one is written in full again (a fresh
// example of a new burst), not as a summary of one.
func TestDeadLetterLogQuietClassStartsOver(t *testing.T) {
	l, rec, clock := newTestDeadLetterLog(DeadLetterLogSummary)
	l.Record(nil, []Letter{decodeLetter("events", 0, 1, 0)})
	clock.Advance(31 * time.Second)
	l.Record(nil, []Letter{decodeLetter("events", 0, 500, 500)})
	if full := rec.Lines("dead letter"); len(full) != 2 {
		t.Errorf("%d full lines, want 2: the class was quiet for an interval", len(full))
	}
	if sums := rec.Lines("dead letters"); len(sums) != 0 {
		t.Errorf("summaries %v, want none: nothing was counted", sums)
	}
}

// TestDeadLetterLogRunWritesDue: a count whose interval passed is written
// by Run although no dead letter comes to trigger it.
func TestDeadLetterLogRunWritesDue(t *testing.T) {
	l, rec, clock := newTestDeadLetterLog(DeadLetterLogSummary)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	l.Record(nil, []Letter{decodeLetter("events", 0, 1, 0), decodeLetter("events", 0, 2, 0)})
	for range 30 {
		testenv.Eventually(t, 5*time.Second, func() bool { return clock.Waiters() > 0 }, "Run waits on the clock")
		if n := len(rec.Lines("dead letters")); n != 0 {
			t.Fatalf("a summary %v before the interval passed", rec.Lines("dead letters"))
		}
		clock.Advance(time.Second)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return len(rec.Lines("dead letters")) == 1 },
		"Run writes the summary once the interval passed")
	if s := rec.Lines("dead letters")[0]; s.Attrs["count"] != int64(1) || s.Attrs["offsets.0"] != "2..2" {
		t.Errorf("summary %v, want 1 dead letter at 2..2", s.Attrs)
	}
}

// askedClock records the waits asked of it; its channels never fire.
type askedClock struct {
	mu    sync.Mutex
	asked []time.Duration
}

func (c *askedClock) Now() time.Time { return clockStart }

func (c *askedClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked = append(c.asked, d)
	return nil
}

func (c *askedClock) first() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.asked) == 0 {
		return 0, false
	}
	return c.asked[0], true
}

// TestDeadLetterLogRunWithoutInterval: a DeadLetterLog built with no
// interval (configuration refuses one, NewDeadLetterLog does not) waits
// between its looks instead of spinning: Run asked the clock for a wait of
// zero, again and again, on one core for the engine's life.
func TestDeadLetterLogRunWithoutInterval(t *testing.T) {
	for _, interval := range []time.Duration{0, -time.Second} {
		t.Run(interval.String(), func(t *testing.T) {
			clock := &askedClock{}
			l := NewDeadLetterLog(DeadLetterLogConfig{Mode: DeadLetterLogSummary, Interval: interval,
				Logger: testenv.NewLogRecorder(slog.LevelDebug).Logger(), Clock: clock})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); l.Run(ctx) }() // ends with cancel
			t.Cleanup(func() { cancel(); <-done })
			var d time.Duration
			testenv.Eventually(t, 5*time.Second, func() bool {
				var ok bool
				d, ok = clock.first()
				return ok
			}, "Run waits on the clock")
			if d <= 0 {
				t.Fatalf("Run waits %v between looks, want a positive wait", d)
			}
		})
	}
}

// TestDeadLetterLogModes: each writes every letter in full, off writes
// nothing, and a nil log writes each letter to the fallback logger.
func TestDeadLetterLogModes(t *testing.T) {
	letters := []Letter{decodeLetter("events", 0, 1, 0), decodeLetter("events", 0, 2, 0), decodeLetter("events", 0, 3, 0)}
	for _, tc := range []struct {
		mode string
		want int
	}{{DeadLetterLogEach, 3}, {DeadLetterLogOff, 0}} {
		t.Run(tc.mode, func(t *testing.T) {
			l, rec, clock := newTestDeadLetterLog(tc.mode)
			l.Record(nil, letters)
			clock.Advance(time.Minute)
			l.Record(nil, letters[:1])
			l.Close()
			if n := len(rec.Lines("dead letter")); n != tc.want+min(tc.want, 1) {
				t.Errorf("%d full lines, want %d", n, tc.want+min(tc.want, 1))
			}
			if n := len(rec.Lines("dead letters")); n != 0 {
				t.Errorf("%d summaries in mode %s, want none", n, tc.mode)
			}
		})
	}
	t.Run("nil", func(t *testing.T) {
		rec := testenv.NewLogRecorder(slog.LevelDebug)
		var l *DeadLetterLog
		l.Record(rec.Logger(), letters)
		l.Close()
		if n := len(rec.Lines("dead letter")); n != 3 {
			t.Errorf("%d lines from a nil log, want 3", n)
		}
	})
}

// pipelineError stands for a configured pipeline's record error
// (pipeline.RecordError), which names the pipeline.
type pipelineError struct {
	name string
	err  error
}

func (e *pipelineError) Error() string        { return "pipeline " + e.name + ": " + e.err.Error() }
func (e *pipelineError) Unwrap() error        { return e.err }
func (e *pipelineError) PipelineName() string { return e.name }

// classedError names its own reason class.
type classedError struct{ class string }

func (e classedError) Error() string       { return "classed" }
func (e classedError) ReasonClass() string { return e.class }

// TestReasonClass: the class names why, never where: two records refused
// for the same cause at different offsets share it; a pipeline's refusal
// names the pipeline, PostgreSQL's the SQLSTATE.
func TestReasonClass(t *testing.T) {
	unique := &pgconn.PgError{Code: "23505", Message: "duplicate key value violates unique constraint"}
	numeric := &pgconn.PgError{Severity: "ERROR", Code: "22P02", Message: `invalid input syntax for type numeric: "4111 1111 1111 1111"`}
	tests := []struct {
		name   string
		letter Letter
		want   Reason
	}{
		{"decode protobuf", Letter{Reason: &event.Error{Kind: event.KindDecode, Format: event.FormatProtobuf, Reason: "cannot parse invalid wire-format data"}, decoding: true}, Reason{Class: "decode"}},
		{"decode json", decodeLetter("t", 0, 1, 1), Reason{Class: "decode"}},
		{"invalid event", Letter{Reason: &event.Error{Kind: event.KindInvalid, Reason: "value is not finite"}, decoding: true}, Reason{Class: "invalid_event"}},
		{"invalid event found by the processor", Letter{Reason: processor.Permanent(fmt.Errorf("record t[0]@9: %w", &event.Error{Kind: event.KindInvalid, Reason: "time is missing"}))}, Reason{Class: "invalid_event"}},
		{"a pipeline topic's json decoder", Letter{Reason: errors.New("json: invalid character 'x' looking for beginning of value"), decoding: true}, Reason{Class: "decode"}},
		{"custom decoder", Letter{Reason: errors.New("custom decoder: bad magic 0x17 at offset 4411"), decoding: true}, Reason{Class: "decode"}},
		{"constraint", Letter{Reason: fmt.Errorf("apply t[0] offsets 120..121: %w", unique)}, Reason{Class: "refused_by_postgres", SQLState: "23505"}},
		{"constraint elsewhere", Letter{Reason: fmt.Errorf("apply t[2] offsets 9..10: %w", unique)}, Reason{Class: "refused_by_postgres", SQLState: "23505"}},
		{"pipeline expression", Letter{Reason: fmt.Errorf("apply t[0] offsets 47..48: pipelines: %w",
			processor.Permanent(&pipelineError{"orders", errors.New("record t[0]@47: amount: no such key: amout")}))}, Reason{Class: "expression", Pipeline: "orders"}},
		{"pipeline refused by postgres", Letter{Reason: fmt.Errorf("apply t[0] offsets 47..48: %w",
			&pipelineError{"orders", fmt.Errorf("upsert 1 rows of orders: %w", numeric)})}, Reason{Class: "refused_by_postgres", Pipeline: "orders", SQLState: "22P02"}},
		{"pipeline error naming its class", Letter{Reason: processor.Permanent(&pipelineError{"orders", classedError{"time"}})}, Reason{Class: "time", Pipeline: "orders"}},
		{"panic", Letter{Reason: processor.Permanent(&PanicError{Value: "nil map", Offset: 40})}, Reason{Class: "processor_panic"}},
		{"processor refused", Letter{Reason: processor.Permanent(errors.New("record t[0]@17: unknown customer 88"))}, Reason{Class: "processor_refused"}},
		{"unclassified", Letter{Reason: errors.New("remote said no"), Attempts: 5}, Reason{Class: "retries_exhausted"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := reasonOf(&tt.letter); got != tt.want {
				t.Errorf("reasonOf(%v) = %+v, want %+v", tt.letter.Reason, got, tt.want)
			}
		})
	}
}

// TestPartitionDeadLettersSummarised: 10,000 records that do not decode,
// through a partition actor, its retry actor and the dead-letter path,
// are two lines in summary mode: the first in full, then one summary with
// the count of the rest and their offsets. Every one still reaches the
// dead-letter topic.
func TestPartitionDeadLettersSummarised(t *testing.T) {
	const n = 10000
	rec := testenv.NewLogRecorder(slog.LevelDebug)
	clock := testenv.NewFakeClock(clockStart)
	dll := NewDeadLetterLog(DeadLetterLogConfig{Mode: DeadLetterLogSummary, Interval: 30 * time.Second,
		Logger: rec.Logger(), Clock: clock})
	app, dlq := &recordingApplier{}, &countingDLQ{}
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
	sink := sys.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
	cfg := &PartitionConfig{
		TP: TopicPartition{Topic: "events", Partition: 2}, Start: 0, BatchSize: 500, Linger: time.Millisecond,
		Format:  event.FormatJSON,
		Retry:   RetryPolicy{InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, MaxAttempts: 1},
		Applier: app, Committer: sink, DLQ: dlq, DLQTopic: "events.dlq",
		Held: NewHeld(nil), Progress: &Progress{}, PanicLimit: 3,
		Seek:          func(*actor.PID, TopicPartition, int64) {},
		Metrics:       metrics.New(prometheus.NewRegistry()),
		Logger:        rec.Logger(),
		DeadLetterLog: dll,
	}
	pid := sys.Root.Spawn(actor.PropsFromProducer(NewPartition(cfg)))
	t.Cleanup(func() { _ = sys.Root.StopFuture(pid).Wait() })

	for from := int64(0); from < n; from += 1000 {
		msgs := make([]*kafka.Message, 0, 1000)
		for off := from; off < from+1000; off++ {
			m := message(off, []byte("{not json"))
			m.TopicPartition.Partition = 2
			msgs = append(msgs, m)
		}
		cfg.Held.Add(len(msgs), messagesBytes(msgs))
		sys.Root.Send(pid, &Records{Msgs: msgs})
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return cfg.Progress.Next.Load() == n },
		"the partition passes all %d records", n)
	if got := dlq.n.Load(); got != n {
		t.Fatalf("%d dead letters written, want %d", got, n)
	}
	full := rec.Lines("dead letter")
	if len(full) != 1 || full[0].Attrs["offset"] != int64(0) || full[0].Attrs["reason"] != "decode" {
		t.Fatalf("full lines %v, want only the first dead letter (offset 0, decode json)", full)
	}
	if len(rec.Lines("dead letters")) != 0 {
		t.Fatalf("a summary before the interval passed")
	}
	clock.Advance(30 * time.Second)
	dll.Close()
	sums := rec.Lines("dead letters")
	if len(sums) != 1 {
		t.Fatalf("%d summaries, want 1", len(sums))
	}
	if s := sums[0].Attrs; s["count"] != int64(n-1) || s["offsets.2"] != "1..9999" || s["topic"] != "events" || s["reason"] != "decode" {
		t.Errorf("summary %v, want %d dead letters of decode json at 2: 1..9999", s, n-1)
	}
	t.Logf("%d dead letters: %d lines in all", n, len(rec.Lines("")))
}

// TestDeadLetterLogKeepsValuesOut: a dead letter's line names its
// pipeline, reason class and SQLSTATE, and its error without the record's
// values (an email address, a card number) unless log.include_values.
func TestDeadLetterLogKeepsValuesOut(t *testing.T) {
	numeric := &pgconn.PgError{Severity: "ERROR", Code: "22P02", Message: `invalid input syntax for type numeric: "4111 1111 1111 1111"`}
	letter := func() Letter {
		return Letter{Record: processor.Record{Topic: "orders", Partition: 1, Offset: 9}, Attempts: 1,
			Reason: fmt.Errorf("apply orders[1] offsets 9..10: %w", &pipelineError{"orders", fmt.Errorf("upsert 1 rows of orders: %w", numeric)})}
	}
	for _, tt := range []struct {
		name          string
		includeValues bool
		wantErr       string
	}{
		{"default", false, `apply orders[1] offsets 9..10: pipeline orders: upsert 1 rows of orders: ERROR: invalid input syntax for type numeric: "…" (SQLSTATE 22P02)`},
		{"opted in", true, `apply orders[1] offsets 9..10: pipeline orders: upsert 1 rows of orders: ERROR: invalid input syntax for type numeric: "4111 1111 1111 1111" (SQLSTATE 22P02)`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, mode := range []string{DeadLetterLogEach, DeadLetterLogSummary} {
				rec := testenv.NewLogRecorder(slog.LevelInfo)
				l := NewDeadLetterLog(DeadLetterLogConfig{Mode: mode, Interval: time.Second, Logger: rec.Logger(),
					Clock: testenv.NewFakeClock(time.Unix(0, 0)), IncludeValues: tt.includeValues})
				l.Record(nil, []Letter{letter()})
				lines := rec.Lines("dead letter")
				if len(lines) != 1 {
					t.Fatalf("%s: %d lines, want 1", mode, len(lines))
				}
				a := lines[0].Attrs
				if a["err"] != tt.wantErr || a["reason"] != "refused_by_postgres" || a["pipeline"] != "orders" || a["sqlstate"] != "22P02" {
					t.Errorf("%s: line %v, want err %q, reason refused_by_postgres, pipeline orders, sqlstate 22P02", mode, a, tt.wantErr)
				}
			}
		})
	}
	// Without a DeadLetterLog (library use) the fallback logger gets no
	// values either.
	rec := testenv.NewLogRecorder(slog.LevelInfo)
	var l *DeadLetterLog
	l.Record(rec.Logger(), []Letter{letter()})
	if lines := rec.Lines("dead letter"); len(lines) != 1 || strings.Contains(fmt.Sprint(lines[0].Attrs["err"]), "4111") {
		t.Errorf("fallback lines %v", lines)
	}
}
