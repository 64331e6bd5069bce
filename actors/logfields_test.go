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

	"github.com/jackc/pgx/v5/pgconn"

	"ratchet/internal/store"
	"ratchet/internal/testenv"
	"ratchet/processor"
)

// correlationApplier fails the first batch starting at transientAt with
// a transient error, and every batch holding the bad offset with a unique
// violation.
type correlationApplier struct {
	mu          sync.Mutex
	transientAt int64
	transient   bool // the transient failure happened
	bad         int64
}

func (a *correlationApplier) ApplyWith(_ context.Context, b processor.Batch, _ *store.Claim, _ store.ApplyOptions) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if b.Start == a.transientAt && !a.transient {
		a.transient = true
		return io.ErrUnexpectedEOF
	}
	for _, r := range b.Records {
		if r.Offset == a.bad {
			return fmt.Errorf("apply %s[%d] offsets %d..%d: %w", b.Topic, b.Partition, b.Start, b.Next,
				&pgconn.PgError{Code: "23505", Message: "duplicate key value violates unique constraint"})
		}
	}
	return nil
}

// failOnceDLQ fails the first request that holds the offset fail.
type failOnceDLQ struct {
	mu     sync.Mutex
	fail   int64
	failed bool
}

func (d *failOnceDLQ) DeadLetter(_ context.Context, letters []Letter) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.failed && slices.ContainsFunc(letters, func(l Letter) bool { return l.Record.Offset == d.fail }) {
		d.failed = true
		return fmt.Errorf("dlq unavailable")
	}
	return nil
}

// TestBatchLinesShareTheirFields: every line about a batch, whichever
// actor writes it (partition, retry, dead letters), carries the batch's
// topic, partition and first_offset, also the lines about a record
// isolated from it, whose own offset is in offset.
func TestBatchLinesShareTheirFields(t *testing.T) {
	rec := testenv.NewLogRecorder(slog.LevelDebug)
	app := &correlationApplier{transientAt: 8, bad: 13}
	h := startPartition(t, app, &failOnceDLQ{fail: 3}, 8, func(cfg *PartitionConfig) { cfg.Logger = rec.Logger() })
	// Batch 0..8: offset 3 does not decode, and its first dead-letter
	// write fails, so the batch is abandoned and read again. Batch 8..16:
	// a transient failure, then offset 13 breaks a constraint and is
	// isolated by halves (12..16, 12..14, 13..14).
	h.send(t, 0, 0, 16, 3)
	if next := h.nextSeek(t); next != 0 {
		t.Fatalf("seek to %d after the failed dead-letter write, want the watermark 0", next)
	}
	h.sys.Root.Send(h.pid, &Seeked{Seek: 1, Next: 0})
	h.send(t, 1, 0, 16, 3)
	testenv.Eventually(t, 10*time.Second, func() bool { return h.cfg.Progress.Next.Load() == 16 }, "the partition applied up to 16")

	type want struct {
		msg    string
		offset int64 // of the line; -1: not checked
		first  int64
		reason string
	}
	for _, w := range []want{
		{"dead letter", 3, 0, "decode"},
		{"batch abandoned; reading it again from the watermark", 0, 0, ""},
		{"transient failure, retrying", 8, 8, ""},
		{"dead letter", 13, 8, "refused_by_postgres"},
	} {
		found := false
		for _, l := range rec.Lines(w.msg) {
			if l.Attrs["offset"] != w.offset {
				continue
			}
			found = true
			if l.Attrs["topic"] != "events" || l.Attrs["partition"] != int64(0) || l.Attrs["first_offset"] != w.first {
				t.Errorf("%q at %d: topic %v partition %v first_offset %v, want events 0 %d",
					w.msg, w.offset, l.Attrs["topic"], l.Attrs["partition"], l.Attrs["first_offset"], w.first)
			}
			if w.reason != "" && l.Attrs["reason"] != w.reason {
				t.Errorf("%q at %d: reason %v, want %s", w.msg, w.offset, l.Attrs["reason"], w.reason)
			}
		}
		if !found {
			t.Errorf("no %q line at offset %d; lines: %v", w.msg, w.offset, rec.Lines(""))
		}
	}
	// No line names a batch by half of its fields.
	for _, l := range rec.Lines("") {
		_, first := l.Attrs["first_offset"]
		_, topic := l.Attrs["topic"]
		_, part := l.Attrs["partition"]
		if first && !(topic && part) {
			t.Errorf("%q has first_offset without topic and partition: %v", l.Msg, l.Attrs)
		}
	}
}
