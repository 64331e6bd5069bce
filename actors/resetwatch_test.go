package actors

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"ratchet/internal/store"
	"ratchet/internal/testenv"
)

// TestStoreMovedOnlyWhenItStillHolds: the partition actor takes a
// ResetWatch hint only when nothing is in flight, its watermark is still
// the one the watch saw, and the epoch is its claim's; then it moves to the
// stored position and seeks there. Stale hints (the normal case while a
// batch commits) must not rewind anything.
func TestStoreMovedOnlyWhenItStillHolds(t *testing.T) {
	app := &gatedApplier{held: make(chan struct{}), release: make(chan struct{})}
	h := startPartition(t, app, &recordingDLQ{}, 4)
	hint := func(epoch, seen, stored int64) {
		h.sys.Root.Send(h.pid, &storeMoved{gen: h.cfg.Gen, epoch: epoch, seen: seen, stored: stored})
	}
	h.send(t, 0, 0, 4)
	<-app.held // batch [0, 4) is in its transaction
	hint(1, 0, 100)
	close(app.release)
	testenv.Eventually(t, 10*time.Second, func() bool { return h.cfg.Progress.Next.Load() == 4 }, "batch [0, 4) applied")

	hint(1, 0, 2)  // seen before the batch applied: stale
	hint(2, 4, 50) // another claim's epoch: the fence's business
	hint(1, 4, 4)  // as believed
	hint(1, 4, 1)  // a reset: move back to 1
	if got := h.nextSeek(t); got != 1 {
		t.Fatalf("first seek to %d, want 1: a stale or foreign hint was taken", got)
	}
	if got := h.cfg.Progress.Next.Load(); got != 1 {
		t.Errorf("published watermark %d after the reset, want 1", got)
	}
	select {
	case s := <-h.seeks:
		t.Errorf("a second seek, to %d", s)
	default:
	}
}

// hintSink records the storeMoved hints it receives.
type hintSink struct {
	mu    sync.Mutex
	hints []*storeMoved
}

func (s *hintSink) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *storeMoved:
		s.mu.Lock()
		s.hints = append(s.hints, m)
		s.mu.Unlock()
	case string:
		c.Respond(m) // a sync: everything sent before it is in
	}
}

func (s *hintSink) got() []*storeMoved {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*storeMoved(nil), s.hints...)
}

// TestResetWatchHintsOnlyDifferences: one round reads the owned rows once
// and hints exactly the tracked partitions whose row differs under their
// own epoch; with nothing tracked it reads nothing; a failed read hints
// nothing.
func TestResetWatchHintsOnlyDifferences(t *testing.T) {
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
	sink := &hintSink{}
	pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return sink }))
	t.Cleanup(func() { _ = sys.Root.StopFuture(pid).Wait() })

	var reads int
	var rows []store.OwnedPosition
	var readErr error
	w := NewResetWatch(ResetWatchConfig{Root: sys.Root, Read: func(context.Context) ([]store.OwnedPosition, error) {
		reads++
		return rows, readErr
	}})
	if err := w.check(context.Background()); err != nil || reads != 0 {
		t.Fatalf("check with nothing tracked: err %v, %d reads; want none", err, reads)
	}

	tp := func(p int32) TopicPartition { return TopicPartition{Topic: "events", Partition: p} }
	for p := range int32(4) {
		w.track(tp(p), uint64(10+p), pid, 3, newProgress(100))
	}
	w.untrack(tp(3), 99) // another generation's stop: tp 3 stays tracked
	w.untrack(tp(2), 12) // tp 2 stopped
	rows = []store.OwnedPosition{
		{Topic: "events", Partition: 0, Next: 100, Epoch: 3}, // as believed
		{Topic: "events", Partition: 1, Next: 0, Epoch: 3},   // reset
		{Topic: "events", Partition: 2, Next: 0, Epoch: 3},   // not running here
		{Topic: "events", Partition: 3, Next: 0, Epoch: 4},   // claimed again
		{Topic: "events", Partition: 7, Next: 0, Epoch: 3},   // unknown
	}
	if err := w.check(context.Background()); err != nil || reads != 1 {
		t.Fatalf("check: err %v, %d reads; want one", err, reads)
	}
	readErr = errors.New("connection refused")
	if err := w.check(context.Background()); !errors.Is(err, readErr) {
		t.Fatalf("check with a failing read: %v, want the read's error", err)
	}
	// A round trip through the sink's mailbox: every hint sent is in.
	if _, err := sys.Root.RequestFuture(pid, "sync", 5*time.Second).Result(); err != nil {
		t.Fatalf("sync: %v", err)
	}
	got := sink.got()
	if len(got) != 1 || *got[0] != (storeMoved{gen: 11, epoch: 3, seen: 100, stored: 0}) {
		t.Errorf("hints %+v, want one for events[1] (gen 11, epoch 3, seen 100, stored 0)", got)
	}
}
