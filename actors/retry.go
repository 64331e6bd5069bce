package actors

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"ratchet/internal/metrics"
	"ratchet/internal/store"
	"ratchet/internal/tracing"
	"ratchet/processor"
)

// RetryPolicy bounds record-level retries.
type RetryPolicy struct {
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	// MaxAttempts is how often a batch that fails with an unclassified error
	// is tried before its records are isolated. Transient errors (connection
	// loss, serialization failures, ...) and configuration errors (the
	// table refuses the statement: store.IsConfigurationError) are retried
	// for as long as they last; record errors (data exceptions, constraint
	// violations, processor.Permanent) are isolated at once.
	MaxAttempts int
}

// Backoff returns the wait before retry number attempt (0-based):
// exponential, capped at MaxBackoff, with jitter in [d/2, d] so partitions
// that failed together do not retry in lockstep.
func (r RetryPolicy) Backoff(attempt int) time.Duration {
	d := r.InitialBackoff
	for i := 0; i < attempt && d < r.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, r.MaxBackoff)
	if d <= 1 {
		return d
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// PanicError is a panic recovered from a processor, with its stack.
type PanicError struct {
	Value  any
	Offset int64 // first offset of the batch that panicked
	Stack  []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("processor panic: %v", e.Value) }

// isPanic reports whether err carries a *PanicError.
func isPanic(err error) bool {
	var pe *PanicError
	return errors.As(err, &pe)
}

// applyBatch asks the retry actor to apply a batch. Sent by the partition
// actor, at most one at a time. Records of the batch's range that did not
// decode were handed to the dead-letter topic when the batch was cut:
// delivery is that write, which the batch's transaction waits for before it
// begins, and dead are their rows for ratchet_dead_letters.
type applyBatch struct {
	batch    processor.Batch
	delivery *dlqWait // nil when the batch had no decode poison
	dead     []store.DeadLetter
	// isolatePanics treats a processor panic as a record error (bisect,
	// dead-letter the record) instead of reporting it to the parent. Set
	// once a batch start has panicked as often as the partition allows.
	isolatePanics bool
	// span is the batch's `process` span, started when it was cut; the
	// retry actor ends it with the outcome (the zero Batch: tracing off).
	span tracing.Batch
}

// batchDone is the retry actor's answer to applyBatch: the batch's range is
// applied (err nil; its poison records dead-lettered), refused by the
// offset guard, failed with a processor panic for the partition to handle,
// or abandoned: the actor is stopping (context.Canceled), or the batch
// could be neither applied nor dead-lettered, and the partition must read
// its range again.
type batchDone struct {
	start, next int64
	err         error
}

// retry applies batches for its parent partition actor. A transient failure
// is retried with backoff for as long as it lasts; a record failure is
// isolated by bisecting the batch, so the good records are applied, in
// order, and each bad record goes to the dead-letter topic. It runs as a
// child so that its parent keeps answering Drain while a batch waits here.
type retry struct {
	ctx           context.Context // cancelled by the parent when it stops or restarts
	cfg           *PartitionConfig
	isolatePanics bool // for the message being handled
	// unrecorded holds dead letters written to the DLQ topic but not yet
	// recorded in PostgreSQL; the next transaction of this batch records
	// them (exactly-once).
	unrecorded []store.DeadLetter
	// inFlight is the dead-letter delivery of the batch's decode poison,
	// started when the partition cut the batch; no transaction of the
	// batch begins before it is done. nil when there is none.
	inFlight *dlqWait
	// first is the first offset of the batch being applied: the halves
	// of its isolation keep it in their log lines, so every line about
	// the batch carries the same first_offset.
	first int64
	span  tracing.Batch // of the message being handled
	// What the records the processor takes out of the message's batch
	// (reject.go) have cost so far: whether it may (off after a dead
	// letter that took too long), their letters already durable (by
	// offset), the offset up to which the failure guard has counted the
	// batch's records, the offsets taken out by the attempt under way, and
	// that attempt's number.
	rejecting  bool
	durable    map[int64]store.DeadLetter
	counted    int64
	rejected   []int64
	attempt    int
	bypassHeld bool // applying the part of a batch before a tripped guard's record
	// parent is told when the batch becomes held (heldNow), so that a
	// drain asked while the batch was still being applied is answered.
	parent func()
}

// heldNow tells the partition actor that its batch in flight is held by
// the pipeline guard from now on: a drain waiting for it is answered.
type heldNow struct{}

func newRetry(ctx context.Context, cfg *PartitionConfig) actor.Producer {
	return func() actor.Actor { return &retry{ctx: ctx, cfg: cfg} }
}

// Receive implements actor.Actor.
func (r *retry) Receive(c actor.Context) {
	msg, ok := c.Message().(*applyBatch)
	if !ok {
		return
	}
	r.isolatePanics = msg.isolatePanics
	r.span = msg.span
	parent := c.Parent()
	r.parent = func() { c.Send(parent, &heldNow{}) }
	err := r.run(msg)
	msg.span.End(batchOutcome(err), err)
	r.span = tracing.Batch{}
	c.Send(c.Parent(), &batchDone{start: msg.batch.Start, next: msg.batch.Next, err: err})
}

func (r *retry) run(msg *applyBatch) error {
	r.first = msg.batch.Start
	r.unrecorded = append(r.unrecorded[:0], msg.dead...)
	r.rejecting = r.cfg.RejectWait >= 0
	clear(r.durable)
	r.counted = msg.batch.Start
	// The delivery started when the batch was cut, usually while the batch
	// before it was applied; safeApply waits for it before each attempt.
	r.inFlight = msg.delivery
	err := r.apply(msg.batch, r.cfg.Retry.MaxAttempts)
	if err == nil && r.inFlight != nil {
		err = r.inFlight.wait(r.ctx) // at-least-once batches of poison only never reach a transaction
	}
	r.inFlight = nil
	if err != nil && r.ctx.Err() == nil && !isPanic(err) && !store.IsOffsetConflict(err) {
		// The partition reads the batch's range again. Wait first, so that
		// a failure that lasts (a DLQ actor gone) is not a busy loop of
		// seeks and re-reads.
		if serr := sleep(r.ctx, r.cfg.Retry.Backoff(r.cfg.Retry.MaxAttempts)); serr != nil {
			return serr
		}
	}
	return err
}

// batchOutcome names how a batch ended, for its span.
func batchOutcome(err error) string {
	switch {
	case err == nil:
		return tracing.BatchApplied
	case store.IsOffsetConflict(err):
		return tracing.BatchFenced
	case isPanic(err):
		return tracing.BatchPanicked
	}
	return tracing.BatchAbandoned
}

// txOutcome names how one transaction ended, for its span.
func txOutcome(err error) string {
	switch {
	case err == nil:
		return tracing.TxCommitted
	case store.IsOffsetConflict(err):
		return tracing.TxRefused
	case store.IsCommitUnknown(err):
		return tracing.TxCommitUnknown
	}
	return tracing.TxRolledBack
}

// apply applies b, retrying per the policy; attempts bounds unclassified
// failures.
func (r *retry) apply(b processor.Batch, attempts int) (result error) {
	var degradedSince time.Time
	configWaiting := false // this batch waits on a configuration error (the guard knows)
	defer func() {
		if configWaiting {
			r.cfg.Guard.configCleared(r.cfg.TP, result == nil)
		}
		if !degradedSince.IsZero() {
			r.cfg.Metrics.DegradedSeconds.Add(time.Since(degradedSince).Seconds())
			r.cfg.Progress.Degraded.Store(false)
		}
	}()
	for attempt := 0; ; attempt++ {
		if len(b.Records) > 0 && !r.bypassHeld {
			// A batch with nothing but the offset advance (and the dead
			// letters written before) still commits: a letter in the
			// dead-letter topic is always recorded as one.
			if t := r.cfg.Guard.Held(b.Topic); t != nil {
				return r.hold(b, t)
			}
		}
		if r.cfg.Claim == nil && len(b.Records) == 0 {
			r.unrecorded = r.unrecorded[:0]
			return nil // at-least-once: nothing to write, the commit moves the offset
		}
		began := time.Now()
		r.attempt = attempt
		err := r.safeApply(b)
		if err == nil {
			r.unrecorded = r.unrecorded[:0]
			r.observe(b, began)
			return nil
		}
		if r.cfg.Claim == nil && store.IsCommitUnknown(err) {
			// At-least-once: the COMMIT went unanswered and may have
			// taken effect; nothing can tell, so applying the batch again,
			// here or by the next owner, may count it twice. Say so, as a
			// member that gives up a commit does (abandon), so every
			// replay is announced; also when this actor is ending.
			n := len(b.Records)
			r.cfg.Metrics.UncommittedRecords.WithLabelValues(b.Topic).Add(float64(n))
			r.cfg.Logger.Error("batch commit unanswered; applying it again may count it twice", batchFields(b.Topic, b.Partition, r.first,
				"actor", "retry", "offset", b.Start, "replay", n, "err", err, r.span.LogAttr())...)
		}
		if r.ctx.Err() != nil {
			return r.ctx.Err()
		}
		var conflict *store.OffsetConflictError
		var trip *guardTripped
		switch {
		case errors.As(err, &trip):
			return r.tripped(b, trip.offset)
		case errors.Is(err, errRejectFallback):
			// The letters of the records taken out could not be made
			// durable in time: nothing committed; apply the batch again
			// the old way, splitting it around them.
			r.rejecting = false
			r.cfg.Logger.Warn("dead letters of refused records slow, isolating them by splitting the batch", batchFields(b.Topic, b.Partition, r.first,
				"actor", "retry", "offset", b.Start, "err", err, r.span.LogAttr())...)
			attempt--
			continue
		case errors.Is(err, errDeadLetter):
			return err
		case errors.As(err, &conflict):
			if attempt > 0 && conflict.Kind == store.Overlap && conflict.StoredEpoch == conflict.Epoch &&
				conflict.StoredNext == b.Next {
				// An earlier attempt committed, but its answer was lost
				// (the connection dropped during COMMIT): the store already
				// holds exactly this batch, under our own epoch.
				r.cfg.Logger.Info("batch was committed by an earlier attempt", batchFields(b.Topic, b.Partition, r.first,
					"actor", "retry", "offset", b.Start, "epoch", conflict.Epoch, r.span.LogAttr())...)
				r.unrecorded = r.unrecorded[:0]
				r.observe(b, began)
				return nil
			}
			return err
		case isPanic(err) && !r.isolatePanics:
			// The parent decides: restart (supervised, logged) and re-read
			// from the watermark, or isolate once the record has used up
			// its restarts.
			return err
		case store.IsTransient(err):
			if degradedSince.IsZero() {
				degradedSince = time.Now()
				r.cfg.Progress.Degraded.Store(true)
			}
			r.cfg.Progress.Retries.Add(1)
			r.cfg.Metrics.Retries.WithLabelValues("transient").Inc()
			r.span.Retry(attempt+1, "transient", err)
			r.cfg.Logger.Warn("transient failure, retrying", batchFields(b.Topic, b.Partition, r.first,
				"actor", "retry", "offset", b.Start, "attempt", attempt+1, "err", err, r.span.LogAttr())...)
		case store.IsPreparedStatementError(err):
			// Configuration (a pooler and named prepared statements), not
			// the data: never isolated or dead-lettered. Retried like an
			// outage, loudly, with what to change.
			if degradedSince.IsZero() {
				degradedSince = time.Now()
				r.cfg.Progress.Degraded.Store(true)
			}
			r.cfg.Progress.Retries.Add(1)
			r.cfg.Metrics.Retries.WithLabelValues("config").Inc()
			r.span.Retry(attempt+1, "config", err)
			r.cfg.Logger.Error("batch refused by configuration, retrying", batchFields(b.Topic, b.Partition, r.first,
				"actor", "retry", "offset", b.Start, "attempt", attempt+1, "err", store.Explain(err), r.span.LogAttr())...)
		case store.IsConfigurationError(err):
			// The table's fault (a column missing or of the wrong type,
			// no unique index the statement can use, no permission):
			// every record would meet it, so none is isolated or
			// dead-lettered. Retried like an outage until the table is
			// fixed; the guard logs it once, readiness names the
			// pipeline and its table.
			if degradedSince.IsZero() {
				degradedSince = time.Now()
				r.cfg.Progress.Degraded.Store(true)
			}
			r.cfg.Guard.configWaiting(r.cfg.TP, err)
			configWaiting = true
			r.cfg.Progress.Retries.Add(1)
			r.cfg.Metrics.Retries.WithLabelValues("config").Inc()
			r.span.Retry(attempt+1, "config", err)
			if attempt == 0 {
				r.cfg.Logger.Warn("batch refused by the table's configuration, waiting", batchFields(b.Topic, b.Partition, r.first,
					"actor", "retry", "offset", b.Start, "err", err, r.span.LogAttr())...)
			}
		case store.IsRecordError(err) || attempt+1 >= attempts:
			r.cfg.Metrics.Retries.WithLabelValues("record").Inc()
			return r.isolate(b, err, attempt+1)
		default:
			r.cfg.Metrics.Retries.WithLabelValues("unclassified").Inc()
			r.cfg.Progress.Retries.Add(1)
			r.span.Retry(attempt+1, "unclassified", err)
			r.cfg.Logger.Warn("batch failed, retrying", batchFields(b.Topic, b.Partition, r.first,
				"actor", "retry", "offset", b.Start, "attempt", attempt+1, "err", err, r.span.LogAttr())...)
		}
		if err := sleep(r.ctx, r.cfg.Retry.Backoff(attempt)); err != nil {
			return err
		}
	}
}

// isolate splits a failing batch in two contiguous halves and applies each,
// until the failing record stands alone; that one is dead-lettered and the
// offset moves past it. Halves are tried once for unclassified errors,
// except a single record, which gets the full attempts.
func (r *retry) isolate(b processor.Batch, cause error, attempts int) error {
	switch len(b.Records) {
	case 0:
		// Only the offset update failed with a record error: nothing to
		// isolate. Surface it: retrying cannot help.
		return fmt.Errorf("offset update of %s[%d] at %d: %w", b.Topic, b.Partition, b.Start, cause)
	case 1:
		if !store.IsRecordError(cause) && attempts < r.cfg.Retry.MaxAttempts {
			return r.apply(b, r.cfg.Retry.MaxAttempts)
		}
		off := b.Records[0].Offset
		if row, ok := r.durable[off]; ok {
			// Taken out by an earlier attempt of this batch, whose
			// letter is durable and counted: record it, once.
			r.unrecorded = append(r.unrecorded, row)
			b.Records = nil
			return r.apply(b, r.cfg.Retry.MaxAttempts)
		}
		if pipeline, _ := pipelineOf(cause); pipeline != "" && off >= r.counted && r.cfg.Guard.Failed(pipeline, cause) {
			// Too many of the pipeline's records failed: its
			// configuration is at fault, not this record.
			return r.hold(b, r.cfg.Guard.Held(b.Topic))
		}
		r.counted = max(r.counted, off+1)
		if err := r.deadLetter(Letter{Record: b.Records[0], Reason: cause, Attempts: attempts, batchStart: r.first}); err != nil {
			return err
		}
		b.Records = nil
		return r.apply(b, r.cfg.Retry.MaxAttempts)
	}
	r.cfg.Metrics.Bisections.WithLabelValues(b.Topic).Inc()
	m := len(b.Records) / 2
	mid := b.Records[m].Offset
	r.span.Bisect(b.Start, mid, b.Next, cause)
	first := processor.Batch{Topic: b.Topic, Partition: b.Partition, Start: b.Start, Next: mid, Records: b.Records[:m]}
	second := processor.Batch{Topic: b.Topic, Partition: b.Partition, Start: mid, Next: b.Next, Records: b.Records[m:]}
	if err := r.apply(first, 1); err != nil {
		return err
	}
	return r.apply(second, 1)
}

// hold keeps b, neither applied nor dead-lettered, until the actor stops:
// t, a pipeline of the batch's topic, tripped its failure guard. Nothing
// of the partition commits past the last applied record; a restart with
// the configuration fixed applies the rest.
func (r *retry) hold(b processor.Batch, t *TrippedPipeline) error {
	r.cfg.Progress.Degraded.Store(true)
	r.cfg.Progress.Held.Store(true) // the partition answers Drain at once
	if r.parent != nil {
		r.parent() // and a Drain that came before
	}
	defer func() {
		r.cfg.Progress.Held.Store(false)
		r.cfg.Progress.Degraded.Store(false)
	}()
	if t != nil {
		r.cfg.Logger.Warn("partition held by the pipeline failure guard", batchFields(b.Topic, b.Partition, r.first,
			"actor", "retry", "offset", b.Start, "pipeline", t.Pipeline, r.span.LogAttr())...)
	}
	<-r.ctx.Done()
	return r.ctx.Err()
}

// safeApply waits for the batch's dead letters, then applies b in one
// transaction (its span, when traced), a processor panic turned into a
// *PanicError so a panicking record is isolated like any other bad record
// instead of killing the batch's context.
func (r *retry) safeApply(b processor.Batch) error {
	if w := r.inFlight; w != nil {
		// Nothing commits before the batch's dead letters are durable. The
		// wait comes before the transaction, so no connection or row lock
		// is held meanwhile; the letters went out when the batch was cut,
		// usually while the batch before it was applied.
		if err := w.wait(r.ctx); err != nil {
			return err
		}
	}
	tx := r.span.StartTx(b.Start, b.Next, len(b.Records))
	err := r.recovered(b)
	tx.End(txOutcome(err), err)
	return err
}

// recovered applies b, turning a processor panic into a *PanicError.
func (r *retry) recovered(b processor.Batch) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = processor.Permanent(&PanicError{Value: v, Offset: b.Start, Stack: debug.Stack()})
		}
	}()
	o := store.ApplyOptions{Dead: r.unrecorded}
	r.rejected = r.rejected[:0]
	if r.rejecting {
		o.Reject = r.rejectHook(b)
	}
	return r.cfg.Applier.ApplyWith(r.ctx, b, r.cfg.Claim, o)
}

// deadLetter writes letters to the dead-letter topic and waits until they
// are durable; they are recorded in PostgreSQL with the next transaction.
func (r *retry) deadLetter(letters ...Letter) error {
	return r.deadLetterAsync(letters).wait(r.ctx)
}

// deadLetterAsync starts writing letters to the dead-letter topic. Their
// rows join the next transaction, which must wait for the returned
// delivery before it commits.
func (r *retry) deadLetterAsync(letters []Letter) *dlqWait {
	w, rows := sendDeadLetters(r.ctx, r.cfg, r.span, letters)
	r.unrecorded = append(r.unrecorded, rows...)
	return w
}

func (r *retry) observe(b processor.Batch, began time.Time) {
	now := time.Now()
	m := r.cfg.Metrics
	part := metrics.Partition(b.Partition)
	applied := len(b.Records) - len(r.rejected)
	m.Records.WithLabelValues(b.Topic, part).Add(float64(applied))
	// The guard counts each record once, in offset order: those taken
	// out, and the applied ones before them, were counted on the way.
	r.cfg.Guard.Applied(b.Topic, len(b.Records)-recordsBefore(b.Records, r.counted))
	r.counted = max(r.counted, b.Next)
	r.cfg.Progress.Records.Add(int64(applied))
	m.Batches.WithLabelValues(b.Topic, part).Inc()
	m.BatchSeconds.WithLabelValues(b.Topic).Observe(now.Sub(began).Seconds())
	e2e := m.EndToEndSeconds.WithLabelValues(b.Topic)
	for i := range b.Records {
		if ts := b.Records[i].Timestamp; !ts.IsZero() {
			e2e.Observe(max(now.Sub(ts).Seconds(), 0))
		}
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
