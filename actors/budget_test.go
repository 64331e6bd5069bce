package actors

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"

	"ratchet/internal/event"
	"ratchet/internal/metrics"
	"ratchet/internal/testenv"
	"ratchet/processor"
)

// blockingDecoder holds the partition actor inside Receive at its first
// record until release is closed, so that the test can queue messages
// behind it.
type blockingDecoder struct {
	inner   ValueDecoder
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (d *blockingDecoder) DecodeRecord(rec *processor.Record) error {
	d.once.Do(func() {
		close(d.entered)
		<-d.release
	})
	return d.inner.DecodeRecord(rec)
}

// budgetHarness is a supervisor with a budget and no consumer, whose
// partition actors are spawned from the root the way spawn sets them up.
type budgetHarness struct {
	s   *Supervisor
	sys *actor.ActorSystem
}

func newBudgetHarness(tb testing.TB, limit int64) *budgetHarness {
	tb.Helper()
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
	s := NewSupervisor(sys, SupervisorConfig{MemoryBudget: limit, MaxBuffered: 1 << 20,
		Metrics: metrics.New(prometheus.NewRegistry()), Logger: slog.New(slog.DiscardHandler)})
	return &budgetHarness{s: s, sys: sys}
}

// partition spawns the actor of events[p] decoding with dec and applying
// with app, and records it as assigned.
func (h *budgetHarness) partition(tb testing.TB, p int32, dec ValueDecoder, app Applier) *assigned {
	tb.Helper()
	tp := TopicPartition{Topic: "events", Partition: p}
	a := &assigned{tp: tp, held: NewHeld(h.s.budget), progress: newProgress(0)}
	sink := h.sys.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
	cfg := &PartitionConfig{
		TP: tp, Start: 0, Format: "raw", BatchSize: 10, Linger: time.Hour,
		Retry:   RetryPolicy{InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond, MaxAttempts: 1},
		Applier: app, Committer: sink, Held: a.held, Progress: a.progress, PanicLimit: 3,
		Seek:       func(*actor.PID, TopicPartition, int64) {},
		NewDecoder: func(string) ValueDecoder { return dec },
		Metrics:    h.s.cfg.Metrics, Logger: h.s.cfg.Logger,
	}
	a.pid = h.sys.Root.Spawn(actor.PropsFromProducer(NewPartition(cfg)))
	h.s.parts[tp] = a
	tb.Cleanup(func() { _ = h.sys.Root.StopFuture(a.pid).Wait() })
	return a
}

// handOver does what flushPending does with records at offsets [from, to)
// of about 1 KB each: count them in the partition's account, and send them.
func (h *budgetHarness) handOver(a *assigned, from, to int64) {
	topic := a.tp.Topic
	var msgs []*kafka.Message
	for off := from; off < to; off++ {
		msgs = append(msgs, &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: a.tp.Partition,
			Offset: kafka.Offset(off)}, Value: []byte(strings.Repeat("v", 1000))})
	}
	a.held.Add(len(msgs), messagesBytes(msgs))
	h.sys.Root.Send(a.pid, &Records{Seek: a.seek, Msgs: msgs})
}

// TestEndedPartitionGivesBackItsMailbox: a lost assignment stops the
// partition actor with records still queued in its mailbox; the Stop
// overtakes them (PITFALLS B6), so the actor never releases them. The
// poll loop, which took their bytes, gives back the partition's whole
// account when it stops it: the budget is back to 0.
func TestEndedPartitionGivesBackItsMailbox(t *testing.T) {
	h := newBudgetHarness(t, 1<<20)
	dec := &blockingDecoder{inner: event.NewDecoder("raw"), entered: make(chan struct{}), release: make(chan struct{})}
	a := h.partition(t, 0, dec, &scriptedApplier{})
	h.handOver(a, 0, 10)
	<-dec.entered // the actor is cutting the first batch
	for off := int64(10); off < 40; off += 10 {
		h.handOver(a, off, off+10) // queued in the mailbox
	}
	if got := h.s.budget.Held(); got < 40*1000 {
		t.Fatalf("budget holds %d bytes with 40 records handed over", got)
	}
	// The Stop of a lost assignment (stopPartitions) reaches the actor
	// while the records are still in its mailbox.
	h.sys.Root.Stop(a.pid)
	done := make(chan struct{})
	go func() { // ends when the actor has stopped (StopFuture: at most 10 s)
		h.s.stopPartitions([]TopicPartition{a.tp}, false)
		close(done)
	}()
	close(dec.release)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("stopPartitions did not return")
	}
	if got := h.s.budget.Held(); got != 0 {
		t.Errorf("budget holds %d bytes after the partition ended; want 0", got)
	}
	if n, b := a.held.Records(), a.held.Bytes(); n != 0 || b != 0 {
		t.Errorf("the ended account holds %d records (%d bytes); want 0", n, b)
	}
	// A release from the ended actor, however late, counts nothing.
	a.held.Release(5, 5000)
	if got := h.s.budget.Held(); got != 0 {
		t.Errorf("a release after the end moved the budget to %d", got)
	}
}

// TestRestartedPartitionGivesBackWhatItHeld: a processor panic restarts
// the partition actor with a batch in flight, batches cut ahead, records
// queued and more in its mailbox. The partition stays assigned (its
// account is not ended): the incarnation that ends gives back what it
// held, the next one drops and gives back what its mailbox still held
// until the seek is confirmed, so the account comes back to 0.
func TestRestartedPartitionGivesBackWhatItHeld(t *testing.T) {
	h := newBudgetHarness(t, 1<<20)
	dec := &blockingDecoder{inner: event.NewDecoder("raw"), entered: make(chan struct{}), release: make(chan struct{})}
	app := &scriptedApplier{held: make(chan struct{}), gate: make(chan struct{}), panics: true}
	a := h.partition(t, 0, dec, app)
	h.handOver(a, 0, 10)
	<-dec.entered
	for off := int64(10); off < 80; off += 10 {
		h.handOver(a, off, off+10)
	}
	close(dec.release)
	<-app.held // the first batch is in its transaction
	if n := a.held.Records(); n != 80 {
		t.Fatalf("%d records counted before the panic, want 80", n)
	}
	close(app.gate) // and panics: the actor restarts
	testenv.Eventually(t, 10*time.Second, func() bool { return a.held.Bytes() == 0 && h.s.budget.Held() == 0 },
		"the restarted partition gave back what it held")
	if n := a.held.Records(); n != 0 {
		t.Errorf("%d records still counted", n)
	}
}
