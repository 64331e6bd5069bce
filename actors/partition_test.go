package actors

import (
	"context"
	"errors"
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
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"ratchet/internal/metrics"
	"ratchet/internal/store"
	"ratchet/internal/testenv"
	ratchetv1 "ratchet/messages/ratchet/v1"
	"ratchet/processor"
)

// gatedApplier holds the first batch until released and records every
// batch it was given.
type gatedApplier struct {
	mu      sync.Mutex
	batches []processor.Batch
	held    chan struct{} // closed when the first batch is being held
	release chan struct{}
	once    sync.Once
}

func (a *gatedApplier) ApplyWith(ctx context.Context, b processor.Batch, _ *store.Claim, _ store.ApplyOptions) error {
	a.mu.Lock()
	a.batches = append(a.batches, b)
	first := len(a.batches) == 1
	a.mu.Unlock()
	if first {
		a.once.Do(func() { close(a.held) })
		select {
		case <-a.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (a *gatedApplier) snapshot() []processor.Batch {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]processor.Batch(nil), a.batches...)
}

// recordingDLQ records the offsets it was asked to dead-letter, and
// whether the gate was still closed when it was asked.
type recordingDLQ struct {
	mu        sync.Mutex
	offsets   []int64
	whileHeld bool
	gate      *gatedApplier
}

func (d *recordingDLQ) DeadLetter(_ context.Context, letters []Letter) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, l := range letters {
		d.offsets = append(d.offsets, l.Record.Offset)
	}
	select {
	case <-d.gate.release:
	default:
		d.whileHeld = true
	}
	return nil
}

func (d *recordingDLQ) snapshot() ([]int64, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]int64(nil), d.offsets...), d.whileHeld
}

// gatedPartition starts a partition actor of batches of 4 (up to maxBatch
// when behind; 0: 4) whose applier holds each transaction until released,
// with a DLQ that records what it was given and whether a batch was held
// meanwhile.
func gatedPartition(t *testing.T, maxBatch int) (*actor.ActorSystem, *gatedApplier, *recordingDLQ, *PartitionConfig, *actor.PID) {
	t.Helper()
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
	app := &gatedApplier{held: make(chan struct{}), release: make(chan struct{})}
	dlq := &recordingDLQ{gate: app}
	sink := sys.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
	tp := TopicPartition{Topic: "events", Partition: 0}
	held := NewHeld(nil)
	cfg := &PartitionConfig{
		TP: tp, Start: 0, Format: "protobuf", BatchSize: 4, MaxBatch: maxBatch, Linger: time.Hour,
		Retry:   RetryPolicy{InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond, MaxAttempts: 1},
		Applier: app, Committer: sink, DLQ: dlq, DLQTopic: "events.dlq",
		Held: held, Progress: &Progress{}, PanicLimit: 3,
		Seek:    func(*actor.PID, TopicPartition, int64) {},
		Metrics: metrics.New(prometheus.NewRegistry()),
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	pid := sys.Root.Spawn(actor.PropsFromProducer(NewPartition(cfg)))
	t.Cleanup(func() { _ = sys.Root.StopFuture(pid).Wait() })
	return sys, app, dlq, cfg, pid
}

// TestPartitionCutsTheNextBatchAhead: while one batch is held in its
// transaction, the partition has already decoded the next ones and written
// their poison records to the DLQ; a drain then applies those batches too,
// so their dead letters are not written again by the next owner.
func TestPartitionCutsTheNextBatchAhead(t *testing.T) {
	sys, app, dlq, cfg, pid := gatedPartition(t, 0)
	held, tp := cfg.Held, cfg.TP

	good, err := proto.Marshal(&ratchetv1.Event{Metric: "m", Time: timestamppb.Now()})
	if err != nil {
		t.Fatal(err)
	}
	topic := tp.Topic
	var msgs []*kafka.Message
	for off := range int64(12) {
		v := good
		if off == 5 || off == 9 {
			v = []byte{0xff, 0xff, 0xff} // does not decode
		}
		msgs = append(msgs, &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Offset: kafka.Offset(off)}, Value: v})
	}
	held.Add(len(msgs), messagesBytes(msgs))
	sys.Root.Send(pid, &Records{Msgs: msgs})

	<-app.held // batch [0, 4) is in its transaction
	testenv.Eventually(t, 10*time.Second, func() bool {
		offs, _ := dlq.snapshot()
		return len(offs) == 2
	}, "the poison records of the next two batches dead-lettered")
	offs, whileHeld := dlq.snapshot()
	slices.Sort(offs) // each batch's letters go out on their own
	if offs[0] != 5 || offs[1] != 9 || !whileHeld {
		t.Fatalf("dead letters %v, written while the first batch was held: %v; want [5 9], true", offs, whileHeld)
	}

	drained := make(chan *Drained, 1)
	go func() { // ends when the partition answers or the future times out
		res, err := sys.Root.RequestFuture(pid, &Drain{}, 10*time.Second).Result()
		if err != nil {
			t.Errorf("drain: %v", err)
			drained <- nil
			return
		}
		drained <- res.(*Drained)
	}()
	close(app.release)
	d := <-drained
	if d == nil {
		return
	}
	if d.Next != 12 {
		t.Errorf("drained at %d, want 12 (the batches cut ahead applied too)", d.Next)
	}
	got := app.snapshot()
	if len(got) != 3 || got[0].Start != 0 || got[0].Next != 4 || got[1].Start != 4 || got[1].Next != 8 ||
		got[2].Start != 8 || got[2].Next != 12 || len(got[1].Records) != 3 || len(got[2].Records) != 3 {
		t.Errorf("batches %+v; want [0,4) with 4 records, [4,8) and [8,12) with 3", got)
	}
	if n, b := held.Records(), held.Bytes(); n != 0 || b != 0 {
		t.Errorf("%d records (%d bytes) still counted as held", n, b)
	}
	if got := testutil.ToFloat64(cfg.Metrics.Poison.WithLabelValues("events", "decode")); got != 2 {
		t.Errorf("ratchet_poison_records_total{reason=decode} = %v, want 2", got)
	}
}

// TestPartitionGrowsBatchesWhenBehind: a partition that keeps up applies
// batches of BatchSize records; one that is behind (more than a batch
// queued) puts up to MaxBatch in one transaction, cuts one such batch
// ahead of the one in flight (with its dead letters on their way), and
// never more than MaxBatch. With MaxBatch at BatchSize (growth off) the
// same records go in batches of BatchSize.
func TestPartitionGrowsBatchesWhenBehind(t *testing.T) {
	type span struct{ start, next int64 }
	for _, tc := range []struct {
		name     string
		maxBatch int
		want     []span
	}{
		{"grows", 10, []span{{0, 4}, {4, 14}, {14, 24}, {24, 28}}},
		{"growth off", 0, []span{{0, 4}, {4, 8}, {8, 12}, {12, 16}, {16, 20}, {20, 24}, {24, 28}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sys, app, dlq, cfg, pid := gatedPartition(t, tc.maxBatch)
			held, tp := cfg.Held, cfg.TP

			good, err := proto.Marshal(&ratchetv1.Event{Metric: "m", Time: timestamppb.Now()})
			if err != nil {
				t.Fatal(err)
			}
			topic := tp.Topic
			records := func(from, to int64) []*kafka.Message {
				var msgs []*kafka.Message
				for off := from; off < to; off++ {
					v := good
					if off == 6 {
						v = []byte{0xff, 0xff, 0xff} // does not decode
					}
					msgs = append(msgs, &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Offset: kafka.Offset(off)}, Value: v})
				}
				held.Add(len(msgs), messagesBytes(msgs))
				return msgs
			}
			// Keeping up: a batch's worth arrives, a batch of BatchSize goes.
			sys.Root.Send(pid, &Records{Msgs: records(0, 4)})
			<-app.held
			// Behind: 24 more arrive while it is in its transaction.
			sys.Root.Send(pid, &Records{Msgs: records(4, 28)})
			testenv.Eventually(t, 10*time.Second, func() bool {
				offs, _ := dlq.snapshot()
				return len(offs) == 1
			}, "the poison record of the batch cut ahead dead-lettered")
			if offs, whileHeld := dlq.snapshot(); offs[0] != 6 || !whileHeld {
				t.Fatalf("dead letters %v, written while the first batch was held: %v; want [6], true", offs, whileHeld)
			}
			close(app.release)
			testenv.Eventually(t, 10*time.Second, func() bool { return held.Records() == 0 }, "every record applied")
			var got []span
			for _, b := range app.snapshot() {
				got = append(got, span{b.Start, b.Next})
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("batches %v, want %v", got, tc.want)
			}
		})
	}
}

// partitionHarness is one partition actor of events[0], spawned from the
// root (a panic restarts it), with the watermarks it asks to seek back to.
type partitionHarness struct {
	sys   *actor.ActorSystem
	pid   *actor.PID
	cfg   *PartitionConfig
	held  *Held
	seeks chan int64
}

// startPartition starts the harness; configure, if given, changes its
// configuration before the actor is spawned.
func startPartition(tb testing.TB, app Applier, dlq DeadLetterer, batchSize int, configure ...func(*PartitionConfig)) *partitionHarness {
	tb.Helper()
	return startPartitionWith(tb, app, dlq, batchSize, func(cfg *PartitionConfig) {
		for _, f := range configure {
			f(cfg)
		}
	})
}

// startPartitionWith is startPartition with tune, when not nil, changing
// the configuration before the actor is spawned.
func startPartitionWith(tb testing.TB, app Applier, dlq DeadLetterer, batchSize int, tune func(*PartitionConfig)) *partitionHarness {
	tb.Helper()
	h := &partitionHarness{
		sys:   actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) })),
		held:  NewHeld(nil),
		seeks: make(chan int64, 16),
	}
	sink := h.sys.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
	h.cfg = &PartitionConfig{
		TP: TopicPartition{Topic: "events", Partition: 0}, Start: 0, Format: "protobuf", BatchSize: batchSize, Linger: time.Hour,
		// Exactly-once: every batch goes to the applier, empty ones too.
		Claim:   &store.Claim{Group: "g", Topic: "events", Partition: 0, Epoch: 1},
		Retry:   RetryPolicy{InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond, MaxAttempts: 1},
		Applier: app, Committer: sink, DLQ: dlq, DLQTopic: "events.dlq",
		Held: h.held, Progress: &Progress{}, PanicLimit: 3,
		Seek:    func(_ *actor.PID, _ TopicPartition, next int64) { h.seeks <- next },
		Metrics: metrics.New(prometheus.NewRegistry()),
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if tune != nil {
		tune(h.cfg)
	}
	h.pid = h.sys.Root.Spawn(actor.PropsFromProducer(NewPartition(h.cfg)))
	tb.Cleanup(func() { _ = h.sys.Root.StopFuture(h.pid).Wait() })
	return h
}

// send hands the partition records at offsets [from, to), read in seek
// generation seek; those at the offsets in poison do not decode.
func (h *partitionHarness) send(tb testing.TB, seek uint64, from, to int64, poison ...int64) {
	tb.Helper()
	good, err := proto.Marshal(&ratchetv1.Event{Metric: "m", Time: timestamppb.Now()})
	if err != nil {
		tb.Fatal(err)
	}
	topic := h.cfg.TP.Topic
	var msgs []*kafka.Message
	for off := from; off < to; off++ {
		v := good
		if slices.Contains(poison, off) {
			v = []byte{0xff, 0xff, 0xff}
		}
		msgs = append(msgs, &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Offset: kafka.Offset(off)}, Value: v})
	}
	h.held.Add(len(msgs), messagesBytes(msgs))
	h.sys.Root.Send(h.pid, &Records{Seek: seek, Msgs: msgs})
}

// nextSeek waits for the partition to ask for a seek.
func (h *partitionHarness) nextSeek(tb testing.TB) int64 {
	tb.Helper()
	select {
	case next := <-h.seeks:
		return next
	case <-time.After(10 * time.Second):
		tb.Fatal("no seek asked for within 10s")
		return 0
	}
}

// drain asks the partition to drain and waits for its answer (at most 5s,
// far less than the drain timeouts the engine uses).
func (h *partitionHarness) drain(tb testing.TB) (*Drained, error) {
	tb.Helper()
	res, err := h.sys.Root.RequestFuture(h.pid, &Drain{}, 5*time.Second).Result()
	if err != nil {
		return nil, err
	}
	return res.(*Drained), nil
}

// scriptedApplier applies batches after gate (if set) is closed, and fails
// those that hold a record at a bad offset with a record error. It keeps
// the batches it applied.
type scriptedApplier struct {
	mu      sync.Mutex
	applied []processor.Batch
	bad     map[int64]bool
	held    chan struct{} // closed when the first batch waits on gate
	gate    chan struct{}
	once    sync.Once
	panics  bool // panic instead of applying, once released
}

func (a *scriptedApplier) ApplyWith(ctx context.Context, b processor.Batch, _ *store.Claim, _ store.ApplyOptions) error {
	if a.gate != nil {
		a.once.Do(func() { close(a.held) })
		select {
		case <-a.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
		if a.panics {
			panic("processor bug")
		}
	}
	for _, r := range b.Records {
		if a.bad[r.Offset] {
			// The reason quotes a value of the record, as real ones do.
			return processor.Permanent(errors.New(`bad record: "jane@example.com" is not a customer`))
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.applied = append(a.applied, b)
	return nil
}

func (a *scriptedApplier) snapshot() []processor.Batch {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]processor.Batch(nil), a.applied...)
}

// flakyDLQ fails its first request, then writes everything.
type flakyDLQ struct {
	mu      sync.Mutex
	calls   int
	offsets []int64
}

func (d *flakyDLQ) DeadLetter(_ context.Context, letters []Letter) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls++
	if d.calls == 1 {
		return errors.New("dlq unavailable")
	}
	for _, l := range letters {
		d.offsets = append(d.offsets, l.Record.Offset)
	}
	return nil
}

// TestAbandonedBatchIsReadAgain: a batch whose record error could not be
// dead-lettered (the DLQ write failed) is neither applied nor cancelled;
// the partition moves back to its watermark and reads the range again,
// instead of cutting its next batch past the records it never applied.
func TestAbandonedBatchIsReadAgain(t *testing.T) {
	app := &scriptedApplier{bad: map[int64]bool{0: true}}
	dlq := &flakyDLQ{}
	h := startPartition(t, app, dlq, 2)

	h.send(t, 0, 0, 2)
	if next := h.nextSeek(t); next != 0 {
		t.Fatalf("seek to %d after the abandoned batch, want the watermark 0", next)
	}
	// Records read before the seek are not the partition's any more.
	h.send(t, 0, 2, 4)
	// The poll loop seeks, and the range comes again.
	h.sys.Root.Send(h.pid, &Seeked{Seek: 1, Next: 0})
	h.send(t, 1, 0, 4)
	testenv.Eventually(t, 10*time.Second, func() bool { return h.cfg.Progress.Next.Load() == 4 },
		"the partition applied up to 4")
	d, err := h.drain(t)
	if err != nil {
		t.Fatalf("drain: %v", err)
	}
	if d.Next != 4 {
		t.Errorf("drained at %d, want 4", d.Next)
	}
	var applied []int64
	next := int64(0)
	for _, b := range app.snapshot() {
		if b.Start != next {
			t.Errorf("a batch applied from %d where the last one ended at %d: %+v", b.Start, next, app.snapshot())
		}
		next = b.Next
		for _, r := range b.Records {
			applied = append(applied, r.Offset)
		}
	}
	if !slices.Equal(applied, []int64{1, 2, 3}) || next != 4 {
		t.Errorf("applied records %v up to %d, want [1 2 3] up to 4 (0 dead-lettered)", applied, next)
	}
	dlq.mu.Lock()
	dead := slices.Clone(dlq.offsets)
	dlq.mu.Unlock()
	if !slices.Equal(dead, []int64{0}) {
		t.Errorf("dead letters %v, want [0]", dead)
	}
	if n, b := h.held.Records(), h.held.Bytes(); n != 0 || b != 0 {
		t.Errorf("%d records (%d bytes) still counted as held", n, b)
	}
}

// TestDrainAnsweredWhenTheBatchPanics: a drain waiting on a batch whose
// processor panics is answered when the actor restarts, with the
// watermark, instead of waiting out the drain timeout; the restarted actor
// starts no batch again.
func TestDrainAnsweredWhenTheBatchPanics(t *testing.T) {
	app := &scriptedApplier{held: make(chan struct{}), gate: make(chan struct{}), panics: true}
	h := startPartition(t, app, DiscardDLQ{}, 2)
	h.send(t, 0, 0, 2)
	<-app.held

	// Queued before the batch can end: the partition holds the drain
	// when the batch panics.
	f := h.sys.Root.RequestFuture(h.pid, &Drain{}, 5*time.Second)
	close(app.gate)
	res, err := f.Result()
	if err != nil {
		t.Fatalf("drain: %v", err)
	}
	if d := res.(*Drained); d.Next != 0 {
		t.Errorf("drained at %d, want the watermark 0", d.Next)
	}
	if next := h.nextSeek(t); next != 0 {
		t.Errorf("the restarted actor sought %d, want 0", next)
	}
	h.sys.Root.Send(h.pid, &Seeked{Seek: 1, Next: 0})
	h.send(t, 1, 0, 2)
	// Answered only after the records above were handled: a batch started
	// for them would hold this drain and show in the applier.
	if _, err := h.drain(t); err != nil {
		t.Fatalf("second drain: %v", err)
	}
	if got := app.snapshot(); len(got) != 0 {
		t.Errorf("batches applied after the drain: %+v", got)
	}
}

// TestFailedDeadLetterWriteIsReadAgain: when the dead-letter write of a
// batch's poison fails (the DLQ stopped, or the wait timed out), the batch
// is read again from the watermark; it is not isolated, which would find
// the same failed write for every record and dead-letter good ones.
func TestFailedDeadLetterWriteIsReadAgain(t *testing.T) {
	app := &scriptedApplier{}
	dlq := &flakyDLQ{}
	h := startPartition(t, app, dlq, 4)
	h.send(t, 0, 0, 4, 2)
	if next := h.nextSeek(t); next != 0 {
		t.Fatalf("seek to %d after the failed dead-letter write, want the watermark 0", next)
	}
	h.sys.Root.Send(h.pid, &Seeked{Seek: 1, Next: 0})
	h.send(t, 1, 0, 4, 2)
	testenv.Eventually(t, 10*time.Second, func() bool { return h.cfg.Progress.Next.Load() == 4 },
		"the partition applied up to 4")
	dlq.mu.Lock()
	dead := slices.Clone(dlq.offsets)
	dlq.mu.Unlock()
	if !slices.Equal(dead, []int64{2}) {
		t.Errorf("dead letters %v, want [2] (the poison only)", dead)
	}
	var applied []int64
	for _, b := range app.snapshot() {
		for _, r := range b.Records {
			applied = append(applied, r.Offset)
		}
	}
	if !slices.Equal(applied, []int64{0, 1, 3}) {
		t.Errorf("applied %v, want [0 1 3]", applied)
	}
}
