package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"ratchet/config"
	"ratchet/internal/store"
	"ratchet/internal/testenv"
	"ratchet/internal/tracing"
)

// TestReplayStopsBeforeItsLeaseIsTaken: run A's link to PostgreSQL is cut
// (a real TCP cut) while a chunk it produced waits for its delivery
// reports, and Kafka stays reachable. A must stop before its lease
// expires by the database's clock, so before run B can take it: return
// with the lease's reason, count nothing of the chunk in flight, leave its
// rows pending and purge what it had not sent. B then replays every dead
// letter exactly once.
func TestReplayStopsBeforeItsLeaseIsTaken(t *testing.T) {
	defer func(d time.Duration) { store.ReplayLeaseTTL = d }(store.ReplayLeaseTTL)
	store.ReplayLeaseTTL = 3 * time.Second
	cluster, addr := testenv.Kafka(t, 2, opsTopic, opsTopic+".dlq")
	o := newOpsEnv(t, addr, config.ModeExactlyOnce)
	const n = 20
	t0 := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	var ls []letter
	for i := range n {
		ls = append(ls, letter{dlqPart: int32(i % 2), srcPart: int32(i % 2), srcOff: int64(i),
			failedAt: t0.Add(time.Duration(i) * time.Second), id: fmt.Sprint("k", i)})
	}
	newDLQWriter(t, addr, nil).write(opsTopic+".dlq", ls...)

	// Produce requests to the source topic are held (the chunk is in
	// flight) until release, then dropped with their connection.
	var hold atomic.Bool
	hold.Store(true)
	held, release := make(chan struct{}), make(chan struct{})
	var heldOnce atomic.Bool
	cluster.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		pr := req.(*kmsg.ProduceRequest)
		if !hold.Load() || len(pr.Topics) == 0 || pr.Topics[0].Topic != opsTopic {
			return nil, nil, false
		}
		if heldOnce.CompareAndSwap(false, true) {
			close(held)
		}
		cluster.SleepControl(func() { <-release })
		return nil, errors.New("dropped by the test"), true
	})
	released := false
	stopHolding := func() {
		if !released {
			released = true
			hold.Store(false)
			close(release)
		}
	}
	t.Cleanup(stopHolding)

	u, err := url.Parse(o.db)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	a := *o
	a.db = u.String()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tr := tracing.New(tp, tracing.Options{})
	aCtx, cancelA := context.WithCancel(context.Background())
	t.Cleanup(cancelA)
	type result struct {
		n   replayCounts
		err error
		at  time.Time
	}
	done := make(chan result, 1)
	stopped := make(chan time.Time, 1)
	replayStopped = func(error) { stopped <- time.Now() }
	t.Cleanup(func() { replayStopped = nil })
	var aOut bytes.Buffer
	go func() { // ends when A's run returns (at the latest with cancelA)
		n, err := replay(aCtx, &aOut, a.config(t), replayOptions{execute: true, tracer: tr}, nil)
		done <- result{n, err, time.Now()}
	}()
	select {
	case <-held:
	case r := <-done:
		t.Fatalf("A ended before producing: %v\n%s", r.err, aOut.String())
	case <-time.After(60 * time.Second):
		t.Fatal("A produced nothing")
	}
	proxy.Cut()
	cut := time.Now()

	var takenAt time.Time
	testenv.Eventually(t, 30*time.Second, func() bool {
		b, err := store.LockReplays(context.Background(), o.pool, opsTopic+".dlq", "b")
		if err != nil {
			return false
		}
		takenAt = time.Now()
		_ = b.Release(context.Background())
		return true
	}, "B takes the lease of A, cut off from PostgreSQL")
	var stoppedAt time.Time
	select {
	case stoppedAt = <-stopped:
	default:
		t.Fatalf("B took the lease %v after A's link to PostgreSQL was cut, and A is still producing: two replays at once",
			takenAt.Sub(cut).Round(time.Millisecond))
	}
	r := <-done
	t.Logf("A stopped producing %v after the cut (its run returned %v after it); B could take the lease %v after it (TTL %v)",
		stoppedAt.Sub(cut).Round(time.Millisecond), r.at.Sub(cut).Round(time.Millisecond),
		takenAt.Sub(cut).Round(time.Millisecond), store.ReplayLeaseTTL)
	if !errors.Is(r.err, store.ErrReplayLeaseLost) || !strings.Contains(r.err.Error(), "not renewed") {
		t.Errorf("A's error: %v, want the lease's reason (not renewed)", r.err)
	}
	runSpans := 0
	for _, s := range rec.Ended() {
		if s.Name() != "dlq replay" {
			continue
		}
		runSpans++
		if s.Status().Code != codes.Error || !strings.Contains(s.Status().Description, "replay lease lost") {
			t.Errorf("A's run span ended with status %v %q, want an error naming the lost lease", s.Status().Code, s.Status().Description)
		}
	}
	if runSpans != 1 {
		t.Errorf("%d dlq replay spans, want A's", runSpans)
	}
	if r.n.replayed != 0 {
		t.Errorf("A counted %d of the chunk in flight as replayed", r.n.replayed)
	}
	if done := o.count(t, `SELECT count(*) FROM ratchet_replays WHERE state = 'done'`); done != 0 {
		t.Errorf("%d rows recorded done by A after the cut", done)
	}
	if pending := o.count(t, `SELECT count(*) FROM ratchet_replays WHERE state = 'pending'`); pending != n {
		t.Errorf("%d rows pending after A stopped, want %d", pending, n)
	}

	stopHolding()
	out := o.mustRun(t, "dlq", "replay", "--execute")
	if got := replayCountsOf(t, out); got != [3]int{n, 0, 0} {
		t.Errorf("B's counts %v, want all %d replayed:\n%s", got, n, lastLines(out, 2))
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
}
