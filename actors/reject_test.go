package actors

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"ratchet/internal/event"
	"ratchet/internal/metrics"
	"ratchet/internal/store"
	"ratchet/internal/testenv"
	"ratchet/processor"
)

// ledgerApplier keeps what an exactly-once store keeps: the stored
// position, how often each record was applied, the recorded dead letters.
// A record whose value is "bad" is refused before anything is sent: taken
// out through ApplyOptions.Reject when it is set, failing the batch
// otherwise. fault, when set, decides after the letters are durable
// whether the transaction commits and what the attempt returns (a
// connection cut before or after the COMMIT).
type ledgerApplier struct {
	mu      sync.Mutex
	next    int64
	applied map[int64]int
	dead    map[int64]bool
	fault   func(rejected int) (commit bool, err error)
}

func (a *ledgerApplier) ApplyWith(ctx context.Context, b processor.Batch, claim *store.Claim, o store.ApplyOptions) error {
	a.mu.Lock()
	next := a.next
	a.mu.Unlock()
	if b.Start != next {
		return &store.OffsetConflictError{Kind: store.Overlap, Topic: b.Topic, Partition: b.Partition, Epoch: claim.Epoch,
			StoredEpoch: claim.Epoch, Start: b.Start, StoredNext: next}
	}
	var rejected []store.Rejected
	var keep []int64
	for _, r := range b.Records {
		if string(r.Value) != "bad" {
			keep = append(keep, r.Offset)
			continue
		}
		err := processor.Permanent(&pipelineError{"p", fmt.Errorf("record %s[%d]@%d: bad", r.Topic, r.Partition, r.Offset)})
		if o.Reject == nil {
			return err
		}
		rejected = append(rejected, store.Rejected{Record: r, Err: err})
	}
	dead := o.Dead
	if len(rejected) > 0 {
		rows, err := o.Reject(ctx, rejected)
		if err != nil {
			return err
		}
		dead = append(slices.Clip(dead), rows...)
	}
	commit, err := true, error(nil)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fault != nil {
		commit, err = a.fault(len(rejected))
	}
	if commit {
		for _, off := range keep {
			a.applied[off]++
		}
		for _, d := range dead {
			a.dead[d.Offset] = true
		}
		a.next = b.Next
	}
	return err
}

// ledgerDLQ counts each record's durable dead letters; while slow is set
// a request waits until its context ends.
type ledgerDLQ struct {
	mu      sync.Mutex
	letters map[int64]int
	slow    bool
}

func (d *ledgerDLQ) DeadLetter(ctx context.Context, letters []Letter) error {
	d.mu.Lock()
	slow := d.slow
	d.slow = false
	d.mu.Unlock()
	if slow {
		<-ctx.Done()
		return ctx.Err()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, l := range letters {
		d.letters[l.Record.Offset]++
	}
	return nil
}

// TestRefusedRecordsSurviveCuts: batches with records refused before any
// statement, taken out of them, through a connection cut before the
// COMMIT, a COMMIT whose answer was lost, and a dead-letter write slower
// than the wait: every other record is applied exactly once, every
// refused one recorded once and in the dead-letter topic (once, but when
// the write was too slow and the batch was split instead, at least once).
func TestRefusedRecordsSurviveCuts(t *testing.T) {
	const n = 200
	bad := func(off int64) bool { return off%17 == 5 }
	for _, tt := range []struct {
		name       string
		fault      func(cut *bool) func(int) (bool, error)
		slow       bool
		onceInDLQ  bool
		bisections bool
	}{
		{name: "cut before commit", onceInDLQ: true, fault: func(cut *bool) func(int) (bool, error) {
			return func(rejected int) (bool, error) {
				if rejected > 0 && !*cut {
					*cut = true
					return false, fmt.Errorf("send batch: %w", io.ErrUnexpectedEOF)
				}
				return true, nil
			}
		}},
		{name: "commit answer lost", onceInDLQ: true, fault: func(cut *bool) func(int) (bool, error) {
			return func(rejected int) (bool, error) {
				if rejected > 0 && !*cut {
					*cut = true
					return true, fmt.Errorf("commit: %w", &store.CommitUnknownError{Err: io.ErrUnexpectedEOF})
				}
				return true, nil
			}
		}},
		{name: "dead letters slow", slow: true, bisections: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var cut bool
			app := &ledgerApplier{applied: map[int64]int{}, dead: map[int64]bool{}}
			if tt.fault != nil {
				app.fault = tt.fault(&cut)
			}
			dlq := &ledgerDLQ{letters: map[int64]int{}, slow: tt.slow}
			reg := prometheus.NewRegistry()
			m := metrics.New(reg)
			sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
			sink := sys.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
			cfg := &PartitionConfig{
				TP: TopicPartition{Topic: "events", Partition: 0}, Start: 0, BatchSize: 50, Linger: time.Millisecond,
				Format: event.FormatRaw, Claim: &store.Claim{Group: "g", Topic: "events", Epoch: 3},
				Retry:   RetryPolicy{InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, MaxAttempts: 3},
				Applier: app, Committer: sink, DLQ: dlq, DLQTopic: "events.dlq",
				Held: NewHeld(nil), Progress: &Progress{}, PanicLimit: 3,
				Seek:       func(*actor.PID, TopicPartition, int64) {},
				Metrics:    m,
				Logger:     slog.New(slog.DiscardHandler),
				RejectWait: 50 * time.Millisecond,
			}
			pid := sys.Root.Spawn(actor.PropsFromProducer(NewPartition(cfg)))
			t.Cleanup(func() { _ = sys.Root.StopFuture(pid).Wait() })
			msgs := make([]*kafka.Message, 0, n)
			for off := range int64(n) {
				v := []byte("good")
				if bad(off) {
					v = []byte("bad")
				}
				msgs = append(msgs, message(off, v))
			}
			cfg.Held.Add(len(msgs), messagesBytes(msgs))
			sys.Root.Send(pid, &Records{Msgs: msgs})
			testenv.Eventually(t, 30*time.Second, func() bool { return cfg.Progress.Next.Load() == n },
				"the partition passes all %d records", n)

			app.mu.Lock()
			defer app.mu.Unlock()
			dlq.mu.Lock()
			defer dlq.mu.Unlock()
			if tt.fault != nil && !cut {
				t.Fatal("the fault was never injected")
			}
			for off := range int64(n) {
				switch {
				case bad(off):
					if app.applied[off] != 0 || !app.dead[off] {
						t.Errorf("refused record %d: applied %d times, recorded as a dead letter: %v", off, app.applied[off], app.dead[off])
					}
					if got := dlq.letters[off]; got == 0 || tt.onceInDLQ && got != 1 {
						t.Errorf("refused record %d: %d dead letters", off, got)
					}
				case app.applied[off] != 1 || app.dead[off]:
					t.Errorf("record %d: applied %d times, dead letter %v; want applied once", off, app.applied[off], app.dead[off])
				}
			}
			rejected := testutil.ToFloat64(m.RejectedRecords.WithLabelValues("events"))
			bisections := testutil.ToFloat64(m.Bisections.WithLabelValues("events"))
			if tt.bisections != (bisections > 0) {
				t.Errorf("%v bisections, want some: %v", bisections, tt.bisections)
			}
			if !tt.bisections && rejected == 0 {
				t.Errorf("no record counted as rejected")
			}
		})
	}
}

// TestGuardTripsOnTakenOutRecordsAsOnSplitting: a pipeline's failure guard
// counts records taken out of their batch in offset order among the
// applied ones, as splitting the batch counts them: it trips on the same
// record, the records before it are applied or dead-lettered alike, and
// the partition holds from it.
func TestGuardTripsOnTakenOutRecordsAsOnSplitting(t *testing.T) {
	// In offset order the guard sees six applied records, then failures:
	// it trips on the seventh failure (6 of the last 10), at offset 12.
	// Counting a batch's failures before its applied records would trip
	// it at offset 7 (2 of 2).
	const n = 14
	bad := map[int64]bool{6: true, 7: true, 8: true, 9: true, 10: true, 12: true}
	type result struct {
		next          int64
		applied, dead []int64
		letters       []int64
	}
	run := func(t *testing.T, wait time.Duration) result {
		app := &ledgerApplier{applied: map[int64]int{}, dead: map[int64]bool{}}
		dlq := &ledgerDLQ{letters: map[int64]int{}}
		m := metrics.New(prometheus.NewRegistry())
		guard := NewGuard(m, slog.New(slog.DiscardHandler))
		guard.Watch("p", "events", GuardLimits{MaxRatio: 0.5, MinFailures: 2, Window: 10})
		sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
		sink := sys.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
		cfg := &PartitionConfig{
			TP: TopicPartition{Topic: "events", Partition: 0}, Start: 0, BatchSize: 50, Linger: time.Millisecond,
			Format: event.FormatRaw, Claim: &store.Claim{Group: "g", Topic: "events", Epoch: 3},
			Retry:   RetryPolicy{InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, MaxAttempts: 3},
			Applier: app, Committer: sink, DLQ: dlq, DLQTopic: "events.dlq",
			Held: NewHeld(nil), Progress: &Progress{}, PanicLimit: 3,
			Seek:    func(*actor.PID, TopicPartition, int64) {},
			Metrics: m, Logger: slog.New(slog.DiscardHandler), Guard: guard, RejectWait: wait,
		}
		pid := sys.Root.Spawn(actor.PropsFromProducer(NewPartition(cfg)))
		t.Cleanup(func() { _ = sys.Root.StopFuture(pid).Wait() })
		msgs := make([]*kafka.Message, 0, n)
		for off := range int64(n) {
			v := []byte("good")
			if bad[off] {
				v = []byte("bad")
			}
			msgs = append(msgs, message(off, v))
		}
		cfg.Held.Add(len(msgs), messagesBytes(msgs))
		sys.Root.Send(pid, &Records{Msgs: msgs})
		testenv.Eventually(t, 30*time.Second, func() bool { return cfg.Progress.Held.Load() }, "the partition holds")
		app.mu.Lock()
		defer app.mu.Unlock()
		dlq.mu.Lock()
		defer dlq.mu.Unlock()
		r := result{next: app.next}
		for off := range int64(n) {
			if app.applied[off] > 0 {
				r.applied = append(r.applied, off)
			}
			if app.dead[off] {
				r.dead = append(r.dead, off)
			}
			if dlq.letters[off] > 0 {
				r.letters = append(r.letters, off)
			}
		}
		return r
	}
	var taken, split result
	t.Run("taken out", func(t *testing.T) { taken = run(t, 0) })
	t.Run("split", func(t *testing.T) { split = run(t, -1) })
	want := result{next: 12, applied: []int64{0, 1, 2, 3, 4, 5, 11}, dead: []int64{6, 7, 8, 9, 10}, letters: []int64{6, 7, 8, 9, 10}}
	for _, r := range []struct {
		name string
		got  result
	}{{"taken out", taken}, {"split", split}} {
		if r.got.next != want.next || !slices.Equal(r.got.applied, want.applied) || !slices.Equal(r.got.dead, want.dead) ||
			!slices.Equal(r.got.letters, want.letters) {
			t.Errorf("%s: %+v, want %+v", r.name, r.got, want)
		}
	}
}
