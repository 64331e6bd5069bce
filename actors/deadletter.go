package actors

// The dead-letter plumbing in one place. A partition cuts a batch and
// starts writing its poison records to the dead-letter topic
// (sendDeadLetters); the retry actor waits for that delivery (dlqWait)
// before the batch's transaction may commit, and dead-letters the records
// it isolates the same way. DLQClient carries the letters to the DLQ actor
// (dlq.go), which produces them and answers once every delivery report
// came back.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"ratchet/internal/event"
	"ratchet/internal/store"
	"ratchet/internal/tracing"
)

// DeadLetterer hands records that can never be applied to the dead-letter
// topic and returns once all are durable there. It blocks (retrying) rather
// than drop anything; it returns an error only when ctx ends.
type DeadLetterer interface {
	DeadLetter(ctx context.Context, letters []Letter) error
}

// errDeadLetter marks a dead-letter write that failed (the DLQ actor
// stopped, or the wait timed out) while the batch's context is alive. The
// batch cannot go on without those letters, and retrying or isolating it
// would only find the same failed write (and, isolating, dead-letter good
// records for it): the batch is given back to the partition, which reads
// its range again.
var errDeadLetter = errors.New("dead-letter write failed")

// dlqWait is a dead-letter request under way.
type dlqWait struct {
	done chan struct{}
	err  error
}

func (w *dlqWait) wait(ctx context.Context) error {
	select {
	case <-w.done:
		return w.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// sendDeadLetters starts writing letters to the partition's dead-letter
// topic and returns the delivery to wait for and the rows that record the
// letters in PostgreSQL. The write ends when the DLQ answered or ctx (the
// partition incarnation's life) ended. Each letter is sent under its own
// `send <dlq topic>` span, a child of the batch's span, whose context the
// dead letter carries.
func sendDeadLetters(ctx context.Context, cfg *PartitionConfig, batch tracing.Batch, letters []Letter) (*dlqWait, []store.DeadLetter) {
	now := time.Now()
	rows := make([]store.DeadLetter, 0, len(letters))
	for i := range letters {
		letters[i].FailedAt = now
		l := letters[i]
		// Spans get the reason as the log does: without the record's
		// values unless log.include_values. Redacting costs four regular
		// expressions a letter, so only for a span that records it.
		var shown string
		if batch.Recording() {
			shown = cfg.DeadLetterLog.Text(l.Reason)
			batch.RecordFailed(l.Record.Offset, errors.New(shown))
		}
		send := batch.StartSend(cfg.DLQTopic)
		letters[i].Trace = send
		if send.Recording() {
			if shown == "" {
				shown = cfg.DeadLetterLog.Text(l.Reason)
			}
			send.String("ratchet.dead_letter.reason", shown)
			send.String("ratchet.dead_letter.topic", l.Record.Topic)
			send.Int("ratchet.dead_letter.partition", int64(l.Record.Partition))
			send.Int("ratchet.dead_letter.offset", l.Record.Offset)
		}
		reason := reasonOf(&l)
		rows = append(rows, store.DeadLetter{Offset: l.Record.Offset, Error: l.Reason.Error(),
			Attempts: l.Attempts, DLQTopic: cfg.DLQTopic, FailedAt: l.FailedAt,
			Reason: reason.Class, Pipeline: reason.Pipeline, SQLState: reason.SQLState})
	}
	cfg.DeadLetterLog.Record(cfg.Logger, letters)
	w := &dlqWait{done: make(chan struct{})}
	go func() { // ends when the DLQ answered or ctx ended
		defer close(w.done)
		defer func() {
			for _, l := range letters {
				l.Trace.End(w.err)
			}
		}()
		if err := cfg.DLQ.DeadLetter(ctx, letters); err != nil {
			w.err = fmt.Errorf("dead letter %s[%d]: %w", letters[0].Record.Topic, letters[0].Record.Partition, err)
			if ctx.Err() == nil {
				w.err = fmt.Errorf("%w: %w", errDeadLetter, w.err)
			}
			return
		}
		cfg.Metrics.DeadLetters.WithLabelValues(letters[0].Record.Topic).Add(float64(len(letters)))
		cfg.Progress.DeadLetters.Add(int64(len(letters)))
		for _, l := range letters {
			// Poison: the value did not decode or broke a rule of the
			// event contract (not a record the processor refused).
			var pe *event.Error
			if errors.As(l.Reason, &pe) {
				cfg.Metrics.Poison.WithLabelValues(l.Record.Topic, string(pe.Kind)).Inc()
			}
			// A record a configured pipeline refused names it.
			var pl interface{ PipelineName() string }
			if errors.As(l.Reason, &pl) {
				cfg.Metrics.PipelineRecords.WithLabelValues(pl.PipelineName(), "dead_lettered").Inc()
			}
		}
	}()
	return w, rows
}

// DLQClient is the DeadLetterer the retry actors use: it asks the DLQ actor
// and waits for every delivery.
type DLQClient struct {
	Root *actor.RootContext
	PID  *actor.PID
	// Timeout bounds the wait for one request (zero: DefaultDLQTimeout).
	// A request that takes longer is cancelled and fails: the batch it
	// belongs to is read again and its letters are sent again, so a DLQ
	// that cannot be written still blocks the partition, and no goroutine
	// waits on it for ever.
	Timeout time.Duration
}

// DefaultDLQTimeout is DLQClient's Timeout when none is set.
const DefaultDLQTimeout = 2 * time.Minute

// DeadLetter implements DeadLetterer. It returns when every letter is
// durable, the DLQ actor failed the request (it stopped), the timeout
// passed, or ctx ended; in the last two cases it cancels the request, so
// the DLQ actor stops retrying it and its future completes.
func (d DLQClient) DeadLetter(ctx context.Context, letters []Letter) error {
	if len(letters) == 0 {
		return nil
	}
	timeout := cmp.Or(d.Timeout, DefaultDLQTimeout)
	req := &deadLetterRequest{letters: letters}
	f := d.Root.RequestFuture(d.PID, req, timeout)
	done := make(chan error, 1)
	go func() { // ends when the future completes: the DLQ answers or fails the request, is gone, or the timeout passes
		res, err := f.Result()
		if err == nil {
			switch r := res.(type) {
			case *deadLettered:
			case *deadLetterFailed:
				err = r.err
			default:
				err = fmt.Errorf("unexpected reply %T", res)
			}
		}
		done <- err
	}()
	select {
	case err := <-done:
		if errors.Is(err, actor.ErrTimeout) {
			d.Root.Send(d.PID, &cancelDeadLetter{req: req})
			return fmt.Errorf("dead letter: no delivery within %s: %w", timeout, err)
		}
		if err != nil {
			return fmt.Errorf("dead letter: %w", err)
		}
		return nil
	case <-ctx.Done():
		d.Root.Send(d.PID, &cancelDeadLetter{req: req})
		return ctx.Err()
	}
}

// DiscardDLQ is a DeadLetterer for processors run without a dead-letter
// topic (tests, library use): the record is only logged and counted.
type DiscardDLQ struct{}

// DeadLetter implements DeadLetterer.
func (DiscardDLQ) DeadLetter(context.Context, []Letter) error { return nil }
