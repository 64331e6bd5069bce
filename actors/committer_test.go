package actors

import (
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"ratchet/internal/metrics"
)

// fakeKafka records every commit request.
type fakeKafka struct {
	mu       sync.Mutex
	requests [][]kafka.TopicPartition
	fail     map[int32]error // per-partition errors to return
}

func (f *fakeKafka) CommitOffsets(offsets []kafka.TopicPartition) ([]kafka.TopicPartition, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cp := append([]kafka.TopicPartition(nil), offsets...)
	f.requests = append(f.requests, cp)
	out := append([]kafka.TopicPartition(nil), offsets...)
	for i := range out {
		out[i].Error = f.fail[out[i].Partition]
	}
	return out, nil
}

func (f *fakeKafka) snapshot() [][]kafka.TopicPartition {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]kafka.TopicPartition(nil), f.requests...)
}

func newTestCommitter(t *testing.T, interval time.Duration) (*actor.ActorSystem, *actor.PID, *fakeKafka, *metrics.Metrics) {
	t.Helper()
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
	fk := &fakeKafka{fail: map[int32]error{}}
	m := metrics.New(prometheus.NewRegistry())
	pid := sys.Root.Spawn(actor.PropsFromProducer(NewCommitter(CommitterConfig{
		Kafka: func() OffsetCommitter { return fk }, Interval: interval, Metrics: m,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})))
	t.Cleanup(func() { _ = sys.Root.StopFuture(pid).Wait() })
	return sys, pid, fk, m
}

func flush(t *testing.T, sys *actor.ActorSystem, pid *actor.PID, msg *Flush) *Flushed {
	t.Helper()
	res, err := sys.Root.RequestFuture(pid, msg, 5*time.Second).Result()
	if err != nil {
		t.Fatalf("flush: %v", err)
	}
	return res.(*Flushed)
}

func TestCommitterCoalescesIntoOneRequest(t *testing.T) {
	// An interval longer than the test: only Flush commits, so the request
	// count is exact.
	sys, pid, fk, _ := newTestCommitter(t, time.Hour)
	for p := int32(0); p < 12; p++ {
		sys.Root.Send(pid, &Register{TP: TopicPartition{"events", p}, Gen: 1, Start: 0})
	}
	for i := int64(1); i <= 10_000; i++ {
		p := int32(i % 12)
		sys.Root.Send(pid, &OffsetApplied{TP: TopicPartition{"events", p}, Gen: 1, Next: i})
	}
	f := flush(t, sys, pid, &Flush{})
	if f.Err != nil {
		t.Fatal(f.Err)
	}
	reqs := fk.snapshot()
	if len(reqs) != 1 {
		t.Fatalf("%d commit requests for 10,000 reports, want 1", len(reqs))
	}
	if len(reqs[0]) != 12 {
		t.Errorf("one request with %d partitions, want 12", len(reqs[0]))
	}
	for _, tp := range reqs[0] {
		// The highest report of partition p is the largest i <= 10000 with i%12 == p.
		want := int64(10_000 - (10_000-int64(tp.Partition))%12)
		if int64(tp.Offset) != want {
			t.Errorf("partition %d committed %d, want %d", tp.Partition, tp.Offset, want)
		}
	}
	// Nothing changed since: a second flush sends nothing.
	flush(t, sys, pid, &Flush{})
	if n := len(fk.snapshot()); n != 1 {
		t.Errorf("an unchanged flush sent a request (%d total)", n)
	}
}

func TestCommitterNeverMovesBackwards(t *testing.T) {
	sys, pid, fk, m := newTestCommitter(t, time.Hour)
	tp := TopicPartition{"events", 0}
	sys.Root.Send(pid, &Register{TP: tp, Gen: 1, Start: 10})
	sys.Root.Send(pid, &OffsetApplied{TP: tp, Gen: 1, Next: 50})
	sys.Root.Send(pid, &OffsetApplied{TP: tp, Gen: 1, Next: 20}) // late, lower: ignored and counted
	sys.Root.Send(pid, &OffsetApplied{TP: tp, Gen: 7, Next: 90}) // another assignment's: ignored
	flush(t, sys, pid, &Flush{})
	reqs := fk.snapshot()
	if len(reqs) != 1 || int64(reqs[0][0].Offset) != 50 {
		t.Fatalf("commits %v, want one commit of 50", reqs)
	}
	if got := testutil.ToFloat64(m.StaleOffsets); got != 1 {
		t.Errorf("stale reports counted %v, want 1", got)
	}
}

func TestCommitterForgetsRevokedPartitions(t *testing.T) {
	sys, pid, fk, _ := newTestCommitter(t, time.Hour)
	a, b := TopicPartition{"events", 0}, TopicPartition{"events", 1}
	sys.Root.Send(pid, &Register{TP: a, Gen: 1, Start: 0})
	sys.Root.Send(pid, &Register{TP: b, Gen: 2, Start: 0})
	sys.Root.Send(pid, &OffsetApplied{TP: a, Gen: 1, Next: 5})
	sys.Root.Send(pid, &OffsetApplied{TP: b, Gen: 2, Next: 7})
	f := flush(t, sys, pid, &Flush{TPs: []TopicPartition{a}, Forget: true}) // revoke a
	if f.Committed[a] != 5 || len(f.Committed) != 1 {
		t.Errorf("revoke flush committed %v, want only %s at 5", f.Committed, a)
	}
	sys.Root.Send(pid, &OffsetApplied{TP: a, Gen: 1, Next: 9}) // after the revoke: must not be committed
	flush(t, sys, pid, &Flush{})
	for _, req := range fk.snapshot()[1:] {
		for _, tp := range req {
			if tp.Partition == 0 {
				t.Errorf("a revoked partition was committed again: %v", tp)
			}
		}
	}
}

func TestCommitterReportsPartitionErrors(t *testing.T) {
	sys, pid, fk, _ := newTestCommitter(t, time.Hour)
	fk.fail[1] = kafka.NewError(kafka.ErrNotCoordinator, "not coordinator", false)
	for p := int32(0); p < 2; p++ {
		sys.Root.Send(pid, &Register{TP: TopicPartition{"events", p}, Gen: 1, Start: 0})
		sys.Root.Send(pid, &OffsetApplied{TP: TopicPartition{"events", p}, Gen: 1, Next: 3})
	}
	f := flush(t, sys, pid, &Flush{})
	if f.Err == nil {
		t.Fatal("a per-partition commit error was not reported")
	}
	// The failed partition is still dirty: the next flush tries it again.
	delete(fk.fail, 1)
	f = flush(t, sys, pid, &Flush{})
	if f.Committed[TopicPartition{"events", 1}] != 3 || len(f.Committed) != 1 {
		t.Errorf("retry committed %v, want only partition 1", f.Committed)
	}
}

func TestBackoffGrowsAndStaysCapped(t *testing.T) {
	p := RetryPolicy{InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}
	for attempt, cap := range []time.Duration{100, 200, 400, 800, 1000, 1000, 1000} {
		c := cap * time.Millisecond
		for range 50 {
			d := p.Backoff(attempt)
			if d < c/2 || d > c {
				t.Fatalf("attempt %d: backoff %v outside [%v, %v]", attempt, d, c/2, c)
			}
		}
	}
}

// TestRefusedCommitIsRetriedOnceRejoined: a periodic commit the group
// refuses because it rebalances is counted by reason and made again as soon
// as the member has rejoined, not a whole interval later.
func TestRefusedCommitIsRetriedOnceRejoined(t *testing.T) {
	sys, pid, fk, m := newTestCommitter(t, time.Hour)
	tp := TopicPartition{"events", 0}
	sys.Root.Send(pid, &Register{TP: tp, Gen: 1, Start: 0})
	sys.Root.Send(pid, &OffsetApplied{TP: tp, Gen: 1, Next: 10})
	fk.mu.Lock()
	fk.fail[0] = kafka.NewError(kafka.ErrRebalanceInProgress, "Broker: Group rebalance in progress", false)
	fk.mu.Unlock()
	sys.Root.Send(pid, &commitTick{}) // the interval elapsed
	waitRequests(t, fk, 1)
	if got := testutil.ToFloat64(m.Commits.WithLabelValues("group_rebalancing")); got != 1 {
		t.Errorf("commits refused for rebalancing: %v, want 1", got)
	}
	fk.mu.Lock()
	delete(fk.fail, 0)
	fk.mu.Unlock()
	sys.Root.Send(pid, &Rejoined{})
	waitRequests(t, fk, 2)
	if got := fk.snapshot()[1]; len(got) != 1 || got[0].Offset != 10 {
		t.Errorf("retried commit: %v, want events[0]@10", got)
	}
	// A rejoin with nothing refused commits nothing.
	sys.Root.Send(pid, &Rejoined{})
	f := flush(t, sys, pid, &Flush{})
	if f.Err != nil || len(f.Pending) != 0 || len(fk.snapshot()) != 2 {
		t.Errorf("after the retry: err %v, pending %v, %d requests", f.Err, f.Pending, len(fk.snapshot()))
	}
}

func waitRequests(tb testing.TB, fk *fakeKafka, n int) {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(fk.snapshot()) < n {
		if time.Now().After(deadline) {
			tb.Fatalf("%d commit requests within 5s, want %d", len(fk.snapshot()), n)
		}
		time.Sleep(5 * time.Millisecond) // polling interval
	}
}
