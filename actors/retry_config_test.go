package actors

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"ratchet/internal/store"
	"ratchet/internal/testenv"
	"ratchet/processor"
)

// failingApplier fails its first batches with err (as many as fails
// says), then applies like recordingApplier.
type failingApplier struct {
	recordingApplier
	err   error
	fails atomic.Int64
}

func (a *failingApplier) ApplyWith(ctx context.Context, b processor.Batch, c *store.Claim, o store.ApplyOptions) error {
	if a.fails.Add(-1) >= 0 {
		return a.err
	}
	return a.recordingApplier.ApplyWith(ctx, b, c, o)
}

// TestPartitionRetriesPreparedStatementErrors: a prepared statement error
// is configuration, not the data: the batch is retried (degraded, counted
// as class "config") and nothing is isolated or dead-lettered, even with
// retry.max_attempts 1.
func TestPartitionRetriesPreparedStatementErrors(t *testing.T) {
	// What a transaction-mode pooler returns to pgx's statement cache.
	app := &failingApplier{err: &pgconn.PgError{Code: "42P05", Message: `prepared statement "stmtcache_1" already exists`}}
	dlq := &countingDLQ{}
	app.fails.Store(5)
	sys, pid, cfg := startDecodingPartition(t, app, dlq, nil)

	var msgs []*kafka.Message
	for off := range int64(4) {
		msgs = append(msgs, message(off, []byte{'a'}))
	}
	cfg.Held.Add(len(msgs), messagesBytes(msgs))
	sys.Root.Send(pid, &Records{Msgs: msgs})

	testenv.Eventually(t, 10*time.Second, func() bool { return len(app.records()) == 4 }, "all records applied")
	for i, r := range app.records() {
		if r.Offset != int64(i) {
			t.Errorf("record %d has offset %d", i, r.Offset)
		}
	}
	if n := dlq.n.Load(); n != 0 {
		t.Errorf("%d records dead-lettered for a configuration error", n)
	}
	if got := testutil.ToFloat64(cfg.Metrics.Retries.WithLabelValues("config")); got != 5 {
		t.Errorf("retries of class config = %v, want 5", got)
	}
}

// TestUnansweredCommitIsAnnouncedAtLeastOnce: in at-least-once mode a batch
// whose COMMIT went unanswered may already be applied; applying it again
// may count it twice, so the retry says so and counts the records in
// ratchet_uncommitted_records_total, as every other replay is announced.
func TestUnansweredCommitIsAnnouncedAtLeastOnce(t *testing.T) {
	// The backend terminated while committing.
	app := &failingApplier{err: fmt.Errorf("commit: %w", &store.CommitUnknownError{
		Err: &pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}})}
	dlq := &countingDLQ{}
	app.fails.Store(1)
	sys, pid, cfg := startDecodingPartition(t, app, dlq, nil)

	var msgs []*kafka.Message
	for off := range int64(4) {
		msgs = append(msgs, message(off, []byte{'a'}))
	}
	cfg.Held.Add(len(msgs), messagesBytes(msgs))
	sys.Root.Send(pid, &Records{Msgs: msgs})

	testenv.Eventually(t, 10*time.Second, func() bool { return len(app.records()) == 4 }, "all records applied")
	if got := testutil.ToFloat64(cfg.Metrics.UncommittedRecords.WithLabelValues("events")); got != 4 {
		t.Errorf("ratchet_uncommitted_records_total = %v, want 4 (the batch whose COMMIT went unanswered)", got)
	}
	if n := dlq.n.Load(); n != 0 {
		t.Errorf("%d records dead-lettered for an unanswered COMMIT", n)
	}
}

// blockedCommitApplier answers no batch until its context ends, and then
// says the COMMIT's fate is unknown: a stop while the COMMIT waits for a
// row lock.
type blockedCommitApplier struct{ entered chan struct{} }

func (a *blockedCommitApplier) ApplyWith(ctx context.Context, _ processor.Batch, _ *store.Claim, _ store.ApplyOptions) error {
	select {
	case a.entered <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return fmt.Errorf("commit: %w", &store.CommitUnknownError{Err: ctx.Err()})
}

// TestUnansweredCommitIsAnnouncedWhenStopping: the partition stops while a
// batch's COMMIT is unanswered. The next owner reads the batch again, and
// the server may still commit it: the replay is announced even though this
// actor never retries.
func TestUnansweredCommitIsAnnouncedWhenStopping(t *testing.T) {
	app := &blockedCommitApplier{entered: make(chan struct{}, 1)}
	sys, pid, cfg := startDecodingPartition(t, app, &countingDLQ{}, nil)
	var msgs []*kafka.Message
	for off := range int64(4) {
		msgs = append(msgs, message(off, []byte{'a'}))
	}
	cfg.Held.Add(len(msgs), messagesBytes(msgs))
	sys.Root.Send(pid, &Records{Msgs: msgs})
	select {
	case <-app.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the batch was never applied")
	}
	if err := sys.Root.StopFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(cfg.Metrics.UncommittedRecords.WithLabelValues("events")); got != 4 {
		t.Errorf("ratchet_uncommitted_records_total = %v, want 4 (the batch whose COMMIT went unanswered at the stop)", got)
	}
}
