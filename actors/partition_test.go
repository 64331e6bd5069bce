package actors

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
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

// TestPartitionCutsTheNextBatchAhead: while one batch is held in its
// transaction, the partition has already decoded the next ones and written
// their poison records to the DLQ; a drain then applies those batches too,
// so their dead letters are not written again by the next owner.
func TestPartitionCutsTheNextBatchAhead(t *testing.T) {
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
	app := &gatedApplier{held: make(chan struct{}), release: make(chan struct{})}
	dlq := &recordingDLQ{gate: app}
	sink := sys.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
	tp := TopicPartition{Topic: "events", Partition: 0}
	var buffered atomic.Int64
	cfg := &PartitionConfig{
		TP: tp, Start: 0, Format: "protobuf", BatchSize: 4, Linger: time.Hour,
		Retry:   RetryPolicy{InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond, MaxAttempts: 1},
		Applier: app, Committer: sink, DLQ: dlq, DLQTopic: "events.dlq",
		Buffered: &buffered, Progress: &Progress{}, PanicLimit: 3,
		Seek:    func(*actor.PID, TopicPartition, int64) {},
		Metrics: metrics.New(prometheus.NewRegistry()),
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	pid := sys.Root.Spawn(actor.PropsFromProducer(NewPartition(cfg)))
	t.Cleanup(func() { _ = sys.Root.StopFuture(pid).Wait() })

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
	buffered.Add(int64(len(msgs)))
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
	if n := buffered.Load(); n != 0 {
		t.Errorf("%d records still counted as buffered", n)
	}
}
