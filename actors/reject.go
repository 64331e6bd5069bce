package actors

// Records a processor refuses before it sends anything (a pipeline's
// expression that fails on the record, a value it cannot convert, a time it
// cannot read) are taken out of their batch (processor.Rejecter) instead of
// failing it: the batch goes on without them, their dead letters are made
// durable before the batch's transaction commits, and their rows join that
// transaction. Splitting the batch in halves until each such record stands
// alone would give the same tables and the same dead letters (reason text,
// headers, failure guard verdicts) at many times the cost. What only
// PostgreSQL can refuse still fails the batch and is isolated by splitting.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"ratchet/internal/store"
	"ratchet/processor"
)

// DefaultRejectWait is PartitionConfig.RejectWait when none is set: how
// long a batch waits for the dead letters of the records taken out of it
// before it falls back to splitting.
const DefaultRejectWait = time.Second

// errRejectFallback fails an attempt whose taken-out records' dead letters
// were not durable within the wait (or could not be written): nothing
// committed, and the batch is applied again without taking records out.
var errRejectFallback = errors.New("dead letters of the records taken out of the batch not durable in time")

// guardTripped fails an attempt in which a pipeline's failure guard
// tripped on the record at offset (taken out by that pipeline): nothing
// committed; what comes before the record is applied, and the partition
// holds from it, as splitting the batch would have left it.
type guardTripped struct{ offset int64 }

func (e *guardTripped) Error() string {
	return fmt.Sprintf("pipeline failure guard tripped at offset %d", e.offset)
}

// rejectHook returns the ApplyOptions.Reject of an attempt at b. For each
// record taken out, in offset order: the failure guard counts it (once per
// batch, after the applied records before it, as splitting would have
// counted them), and its letter is written unless an earlier attempt made
// it durable; the hook returns once every letter is durable, with the rows
// that record them.
func (r *retry) rejectHook(b processor.Batch) func(context.Context, []store.Rejected) ([]store.DeadLetter, error) {
	return func(ctx context.Context, rejected []store.Rejected) ([]store.DeadLetter, error) {
		attempts := 1 // a record isolated by splitting fails alone on its first try
		if len(b.Records) == 1 {
			attempts = r.attempt + 1
		}
		var letters []Letter
		for _, rj := range rejected {
			off := rj.Record.Offset
			if _, ok := r.durable[off]; ok {
				continue
			}
			if off >= r.counted {
				r.cfg.Guard.Applied(b.Topic, recordsBefore(b.Records, off)-recordsBefore(b.Records, r.counted))
				r.counted = off
				if pipeline, _ := pipelineOf(rj.Err); pipeline != "" && r.cfg.Guard.Failed(pipeline, rj.Err) {
					return nil, &guardTripped{offset: off}
				}
				r.counted = off + 1
			}
			letters = append(letters, Letter{Record: rj.Record, Reason: rj.Err, Attempts: attempts, batchStart: r.first})
		}
		if len(letters) > 0 {
			wctx, cancel := context.WithTimeout(ctx, r.rejectWait())
			defer cancel()
			w, rows := sendDeadLetters(wctx, r.cfg, r.span, letters)
			if err := w.wait(wctx); err != nil {
				if r.ctx.Err() != nil {
					return nil, r.ctx.Err()
				}
				return nil, fmt.Errorf("%w: %w", errRejectFallback, err)
			}
			if r.durable == nil {
				r.durable = map[int64]store.DeadLetter{}
			}
			for i, row := range rows {
				r.durable[letters[i].Record.Offset] = row
			}
			r.cfg.Metrics.RejectedRecords.WithLabelValues(b.Topic).Add(float64(len(letters)))
		}
		out := make([]store.DeadLetter, 0, len(rejected))
		for _, rj := range rejected {
			out = append(out, r.durable[rj.Record.Offset])
			r.rejected = append(r.rejected, rj.Record.Offset)
		}
		return out, nil
	}
}

// rejectWait is how long an attempt waits for its letters.
func (r *retry) rejectWait() time.Duration {
	if r.cfg.RejectWait > 0 {
		return r.cfg.RejectWait
	}
	return DefaultRejectWait
}

// tripped ends a batch whose record at offset tripped its pipeline's
// failure guard: the records before it are applied (their own refused
// records dead-lettered), then the partition holds, as splitting the
// batch would have left it.
func (r *retry) tripped(b processor.Batch, offset int64) error {
	i := recordsBefore(b.Records, offset)
	if offset > b.Start {
		prefix := processor.Batch{Topic: b.Topic, Partition: b.Partition, Start: b.Start, Next: offset, Records: b.Records[:i]}
		r.bypassHeld = true // the guard holds the topic from the record on, not before it
		err := r.apply(prefix, r.cfg.Retry.MaxAttempts)
		r.bypassHeld = false
		if err != nil {
			return err
		}
		b = processor.Batch{Topic: b.Topic, Partition: b.Partition, Start: offset, Next: b.Next, Records: b.Records[i:]}
	}
	return r.hold(b, r.cfg.Guard.Held(b.Topic))
}

// recordsBefore is the number of records (in offset order) before offset.
func recordsBefore(recs []processor.Record, offset int64) int {
	i, _ := slices.BinarySearchFunc(recs, offset, func(r processor.Record, o int64) int { return cmp.Compare(r.Offset, o) })
	return i
}
