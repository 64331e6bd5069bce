package actors

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/internal/event"
	"ratchet/internal/metrics"
	"ratchet/internal/store"
	"ratchet/internal/tracing"
	"ratchet/processor"
)

// Applier applies one batch in one PostgreSQL transaction. With a claim
// (exactly-once) the same transaction moves the stored offset from b.Start to
// b.Next, guarded by the claim's epoch. *store.Store implements it.
type Applier interface {
	ApplyWith(ctx context.Context, b processor.Batch, claim *store.Claim, o store.ApplyOptions) error
}

// PartitionConfig configures one partition actor.
type PartitionConfig struct {
	TP        TopicPartition
	Gen       uint64       // assignment generation, for the committer
	Start     int64        // first offset to apply; -1 when unknown (take the first record's)
	Claim     *store.Claim // exactly-once claim; nil in at-least-once mode
	Format    string       // protobuf, json or raw; used when NewDecoder is nil
	BatchSize int
	// MaxBatch is the most records a batch takes when the partition is
	// behind: more than BatchSize queued when the batch is cut (0:
	// BatchSize, no growth).
	MaxBatch  int
	Linger    time.Duration
	Retry     RetryPolicy
	Applier   Applier
	Committer *actor.PID
	DLQ       DeadLetterer
	DLQTopic  string // where this partition's dead letters go
	// Held counts the records (and their bytes) handed to this partition
	// and not yet applied or dropped, against the instance's memory
	// budget. The poll loop adds, the actor releases; the poll loop pauses
	// the partition above its cap (budget.go).
	Held *Held
	// Progress is published for observers (page, readiness, lag).
	Progress *Progress
	// PanicLimit is how often a batch start may panic (each time a
	// supervised restart and a re-read) before its records are isolated
	// and the panicking one is dead-lettered.
	PanicLimit int
	// Seek asks the poll loop to move the fetch position to next (after a
	// restart); the answer arrives as *Seeked.
	Seek    func(self *actor.PID, tp TopicPartition, next int64)
	Metrics *metrics.Metrics
	Logger  *slog.Logger
	// NewDecoder returns the value decoder of this partition, called once
	// per partition assignment; nil means an event.Decoder for Format.
	NewDecoder func(topic string) ValueDecoder
	// ResetWatch, in exactly-once mode, tells the actor when its stored
	// position moved while it is idle (resetwatch.go); nil: off.
	ResetWatch *ResetWatch
	// DeadLetterLog writes the log lines about this partition's dead
	// letters (shared by the instance's partitions); nil: a line each.
	DeadLetterLog *DeadLetterLog
	// Tracer makes the spans of the partition's batches; nil: off.
	Tracer *tracing.Tracer
	// Guard holds the partition for a fault no record is to blame for (a
	// table that refuses the statement, a pipeline whose failure guard
	// tripped; guard.go); shared by the instance's partitions. nil: none.
	Guard *Guard
	// RejectWait bounds how long a batch waits, before it commits, for the
	// dead letters of the records its processor took out of it
	// (processor.Rejecter; reject.go): past it the batch is rolled back
	// and applied again with those records isolated by splitting the
	// batch. Zero: DefaultRejectWait; negative: records are never taken
	// out, every refusal splits the batch.
	RejectWait time.Duration
}

// partitionState is what a partition actor keeps across supervised
// restarts: the producer closes over it, every incarnation reads it in
// Started. Only the current incarnation touches it.
type partitionState struct {
	next     int64  // first offset not applied
	seek     uint64 // accepted seek generation
	restarts int
	fenced   bool
	// draining outlives a restart: a partition asked to drain starts no
	// batch again, whichever incarnation is current.
	draining bool
	panics   map[int64]int // batch start offset → processor panics there
	dec      ValueDecoder
}

// ValueDecoder decodes the records of one partition: it sets rec.Event (or
// rec.Decoded) from rec.Value. Every error it returns makes the record
// poison: it goes to the dead-letter topic with the error as the reason.
// It is called on the partition's goroutine only, so it may keep state
// (*event.Decoder interns strings).
type ValueDecoder interface {
	DecodeRecord(rec *processor.Record) error
}

// Resolver is implemented by a ValueDecoder that must look something up in
// another service before it can decode some values (the schemas of a
// schema registry). Before the partition cuts a batch it asks Missing for
// each record; while any lookup is missing it cuts nothing, runs Resolve
// off its goroutine, retried with the retry policy's backoff for as long
// as the service is unavailable (the partition reports degraded), and
// calls learn on its own goroutine when Resolve succeeded. An unavailable
// service therefore only delays the partition; it never makes a record
// poison.
type Resolver interface {
	// Missing reports whether decoding value needs a lookup the decoder
	// has not learned yet. No I/O; called on the partition's goroutine.
	Missing(value []byte) bool
	// Resolve looks up what values need. An error means the service is
	// unavailable and Resolve is called again after a backoff; answers
	// that make a record poison (an unknown schema) are not errors but
	// part of what learn teaches. Resolve runs on its own goroutine and
	// must not touch the decoder's state; learn does, on the partition's.
	Resolve(ctx context.Context, values [][]byte) (learn func(), err error)
}

// Partition applies one partition's records in order, one batch in flight at
// a time, so its watermark is always contiguous. The batch I/O runs in its
// child, the retry actor; the partition itself only buffers and decides, so
// Drain is answered promptly even while a batch is slow.
type Partition struct {
	cfg   *PartitionConfig
	state *partitionState

	// queue holds the records read and not yet in a batch, undecoded:
	// decoding happens when a batch is cut, so a full buffer costs the raw
	// records only.
	queue      []*kafka.Message
	queueBytes int64     // recordBytes of queue
	firstAt    time.Time // arrival of queue[0]
	lastQueued int64     // offset after the last queued record
	inFlight   *applyBatch
	inFlightN  int   // raw records the batch in flight covers
	inFlightB  int64 // and their recordBytes
	// ready holds up to cutAhead full batches after inFlight, cut and
	// decoded while it is in its transaction, their dead letters already on
	// their way; the first is sent the moment inFlight is applied. Only
	// ever non-empty while inFlight is set.
	ready []cutBatch
	// drainers wait for the batch in flight; they are answered when it
	// ends, and by Restarting and Stopping when it never will (a panic, a
	// stop), so a revoke does not wait out its whole drain timeout.
	drainers  []*actor.PID
	awaitSeek bool // restarted: drop records until the seek is confirmed
	// lookingUp is set while the decoder's lookups for the head of the
	// queue run (see Resolver); nothing is cut meanwhile.
	lookingUp bool

	retry *actor.PID
	// ctx is this incarnation's life (cancelled on restart and stop); dead
	// letters of a cut batch are written under it.
	ctx         context.Context
	retryCancel context.CancelFunc
	timer       *time.Timer
	timerSeq    uint64
}

// cutBatch is a batch cut ahead, the raw records it covers and their
// recordBytes.
type cutBatch struct {
	msg   *applyBatch
	n     int
	bytes int64
}

// cutAhead bounds the batches a partition cuts ahead of the one in flight.
// A batch with poison records cannot begin before their dead letters are
// durable; cutting several batches ahead starts those writes several
// transactions early, so the DLQ round trip (tens of milliseconds when the
// broker is busy serving a backlog) stays off the partition's path. It
// costs up to cutAhead × batch_size decoded records per partition; batches
// grown past batch_size (MaxBatch) are cut ahead only whole and fewer of
// them (ahead): as many as fit in that bound, at least one.
const cutAhead = 4

// NewPartition returns the producer of a partition actor.
func NewPartition(cfg *PartitionConfig) actor.Producer {
	var dec ValueDecoder
	if cfg.NewDecoder != nil {
		dec = cfg.NewDecoder(cfg.TP.Topic)
	} else {
		dec = event.NewDecoder(cfg.Format)
	}
	st := &partitionState{next: cfg.Start, panics: map[int64]int{}, dec: dec}
	return func() actor.Actor { return &Partition{cfg: cfg, state: st} }
}

func (p *Partition) log() *slog.Logger {
	return p.cfg.Logger.With("actor", "partition", "topic", p.cfg.TP.Topic, "partition", p.cfg.TP.Partition)
}

// batchLog is log for the lines about the batch starting at first (see
// batchFields).
func (p *Partition) batchLog(first int64) *slog.Logger {
	return p.cfg.Logger.With(batchFields(p.cfg.TP.Topic, p.cfg.TP.Partition, first, "actor", "partition")...)
}

// Receive implements actor.Actor.
func (p *Partition) Receive(c actor.Context) {
	switch msg := c.Message().(type) {
	case *actor.Started:
		p.started(c)
	case *Records:
		p.enqueue(c, msg)
	case *lingerExpired:
		if msg.seq == p.timerSeq {
			p.maybeDispatch(c, true)
		}
	case *batchDone:
		p.batchDone(c, msg)
	case *lookedUp:
		p.lookedUp(c, msg)
	case *Drain:
		p.state.draining = true
		// A batch held by the pipeline guard runs no transaction and
		// ends only when the actor stops: the watermark is final.
		if p.inFlight == nil || p.cfg.Progress.Held.Load() {
			c.Respond(&Drained{TP: p.cfg.TP, Next: p.state.next})
			return
		}
		p.drainers = append(p.drainers, c.Sender())
	case *heldNow:
		// The batch in flight became held by the pipeline guard after a
		// drain was asked: it ends only with the actor, so the watermark
		// is final.
		if p.cfg.Progress.Held.Load() {
			p.answerDrainers(c)
		}
	case *Seeked:
		p.seeked(c, msg)
	case *storeMoved:
		p.storeMoved(c, msg)
	case *actor.Stopped:
		p.cfg.ResetWatch.untrack(p.cfg.TP, p.cfg.Gen)
	case *actor.Restarting, *actor.Stopping:
		p.stopTimer()
		if p.retryCancel != nil {
			p.retryCancel()
		}
		// Records still queued were never applied: they are no longer ours
		// to account for (a restart re-reads them after the seek, a stop
		// hands them to the next owner).
		p.release(len(p.queue)+p.inFlightN, p.queueBytes+p.inFlightB)
		p.queue, p.queueBytes, p.inFlight, p.inFlightN, p.inFlightB = nil, 0, nil, 0, 0
		p.dropReady()
		// The batch in flight is gone unapplied: the watermark is final
		// for this incarnation.
		p.answerDrainers(c)
	}
}

func (p *Partition) started(c actor.Context) {
	ctx, cancel := context.WithCancel(context.Background())
	p.ctx, p.retryCancel = ctx, cancel
	p.retry = c.Spawn(actor.PropsFromProducer(newRetry(ctx, p.cfg)))
	p.lastQueued = p.state.next
	p.cfg.ResetWatch.track(p.cfg.TP, p.cfg.Gen, c.Self(), p.epoch(), p.cfg.Progress)
	if p.state.restarts > 0 {
		// A restarted incarnation cannot trust its mailbox: records after
		// the failed one may be queued, the failed one is gone. Ask for the
		// fetch position to move back to the watermark and ignore
		// everything until that is confirmed.
		p.awaitSeek = true
		p.cfg.Seek(c.Self(), p.cfg.TP, p.state.next)
	}
	p.state.restarts++
}

func (p *Partition) seeked(c actor.Context, msg *Seeked) {
	if msg.Err != nil {
		// The poll loop could not seek (the partition is being revoked, or
		// the consumer is being rebuilt). Stay quiet: the next owner, or the
		// next assignment, starts from the committed watermark.
		p.log().Warn("seek after restart failed", "offset", msg.Next, "err", msg.Err)
		return
	}
	p.awaitSeek = false
	p.state.seek = msg.Seek
	p.lastQueued = p.state.next
}

func (p *Partition) enqueue(c actor.Context, msg *Records) {
	if p.awaitSeek || msg.Seek < p.state.seek || p.state.fenced {
		p.release(len(msg.Msgs), messagesBytes(msg.Msgs))
		return
	}
	dropped, droppedBytes := 0, int64(0)
	for _, m := range msg.Msgs {
		off := int64(m.TopicPartition.Offset)
		if p.lastQueued >= 0 && off < p.lastQueued {
			dropped++ // already applied or already queued: a redelivery
			droppedBytes += recordBytes(m)
			continue
		}
		if p.state.next < 0 {
			p.state.next = off // first record of a partition with no position
		}
		p.lastQueued = off + 1
		if len(p.queue) == 0 {
			p.firstAt = time.Now()
		}
		p.queue = append(p.queue, m)
		p.queueBytes += recordBytes(m)
	}
	p.release(dropped, droppedBytes)
	p.maybeDispatch(c, false)
}

// decode fills rec from m and decodes it; the error is the reason it is
// poison (or ErrSkip). rec is the batch's own slot, so that the record is
// not built on the heap once more for the decoder's sake.
func (p *Partition) decode(rec *processor.Record, m *kafka.Message) error {
	*rec = processor.Record{
		Topic:         p.cfg.TP.Topic,
		Partition:     p.cfg.TP.Partition,
		Offset:        int64(m.TopicPartition.Offset),
		Key:           m.Key,
		Value:         m.Value,
		Timestamp:     m.Timestamp,
		TimestampType: timestampType(m.TimestampType),
	}
	if len(m.Headers) > 0 {
		// One small allocation for the header structs; their values are
		// shared, not copied.
		rec.Headers = make([]processor.Header, len(m.Headers))
		for i, h := range m.Headers {
			rec.Headers[i] = processor.Header{Key: h.Key, Value: h.Value}
		}
	}
	if err := p.state.dec.DecodeRecord(rec); err != nil {
		rec.Event, rec.Decoded = nil, nil
		return err
	}
	return nil
}

func timestampType(t kafka.TimestampType) processor.TimestampType {
	switch t {
	case kafka.TimestampCreateTime:
		return processor.TimestampCreateTime
	case kafka.TimestampLogAppendTime:
		return processor.TimestampLogAppendTime
	}
	return processor.TimestampNone
}

// lookedUp is the answer of a partition's lookups (see Resolver): learn
// teaches the decoder what they found; err is set only when the lookups
// were abandoned because the incarnation ctx ended. Sent by the lookup
// goroutine to the partition actor.
type lookedUp struct {
	ctx   context.Context // the incarnation that asked
	learn func()
	err   error
}

// awaitLookups reports whether the first n queued records must wait for
// lookups before they can be decoded, and starts them if none are running.
func (p *Partition) awaitLookups(c actor.Context, n int) bool {
	r, ok := p.state.dec.(Resolver)
	if !ok {
		return false
	}
	if p.lookingUp {
		return true
	}
	var values [][]byte
	for _, m := range p.queue[:n] {
		if r.Missing(m.Value) {
			values = append(values, m.Value)
		}
	}
	if len(values) == 0 {
		return false
	}
	p.lookingUp = true
	ctx, self, root := p.ctx, c.Self(), c.ActorSystem().Root
	go func() { // ends when the lookups succeeded or ctx (this incarnation) ended
		learn, err := resolve(ctx, p.cfg, r, values)
		root.Send(self, &lookedUp{ctx: ctx, learn: learn, err: err})
	}()
	return true
}

func (p *Partition) lookedUp(c actor.Context, msg *lookedUp) {
	if msg.ctx != p.ctx {
		return // asked by an earlier incarnation
	}
	p.lookingUp = false
	if msg.err != nil {
		return
	}
	msg.learn()
	p.maybeDispatch(c, false)
}

// lookupMaxBackoff caps the retry policy's backoff between lookups: a
// lookup is one small request, and the partition should go on within
// seconds of the service's return rather than after retry.max_backoff.
const lookupMaxBackoff = 5 * time.Second

// resolve runs r.Resolve until it succeeds or ctx ends, waiting the retry
// policy's backoff (capped at lookupMaxBackoff) between attempts;
// meanwhile the partition reports degraded, as for a transient database
// failure.
func resolve(ctx context.Context, cfg *PartitionConfig, r Resolver, values [][]byte) (func(), error) {
	var degradedSince time.Time
	defer func() {
		if !degradedSince.IsZero() {
			cfg.Metrics.DegradedSeconds.Add(time.Since(degradedSince).Seconds())
			cfg.Progress.Degraded.Store(false)
		}
	}()
	for attempt := 0; ; attempt++ {
		learn, err := r.Resolve(ctx, values)
		if err == nil {
			return learn, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if degradedSince.IsZero() {
			degradedSince = time.Now()
		}
		cfg.Progress.Degraded.Store(true)
		cfg.Progress.Retries.Add(1)
		cfg.Metrics.Retries.WithLabelValues("lookup").Inc()
		cfg.Logger.Warn("lookup failed, retrying", "actor", "partition", "topic", cfg.TP.Topic,
			"partition", cfg.TP.Partition, "attempt", attempt+1, "err", err)
		if err := sleep(ctx, min(cfg.Retry.Backoff(attempt), lookupMaxBackoff)); err != nil {
			return nil, err
		}
	}
}

// maybeDispatch starts the next batch when none is in flight and the queue
// holds a full batch, or its oldest record has waited the linger time. A
// partition that is behind (more than a batch queued) puts up to MaxBatch
// records in it: one transaction, one COMMIT and one offset advance for
// them all, so a backlog costs PostgreSQL and ratchet fewer of each, while
// at rates a batch keeps up with nothing changes (a batch is BatchSize
// records or what the linger gathered). With a batch in flight it cuts
// the next full ones ahead (up to ahead), so their decoding and their dead
// letters' delivery overlap the transactions before them. Which records
// share a batch never changes what is written: see the determinism tests.
func (p *Partition) maybeDispatch(c actor.Context, lingerDue bool) {
	if p.state.draining {
		return
	}
	size := p.maxBatch()
	if p.inFlight != nil {
		for len(p.ready) < p.ahead() && len(p.queue) >= size && !p.awaitLookups(c, size) {
			b, n, bytes := p.cut(size)
			p.ready = append(p.ready, cutBatch{msg: b, n: n, bytes: bytes})
		}
		return
	}
	if len(p.queue) == 0 {
		return
	}
	waited := time.Since(p.firstAt)
	if len(p.queue) < p.cfg.BatchSize && !lingerDue && waited < p.cfg.Linger {
		p.armTimer(c, p.cfg.Linger-waited)
		return
	}
	if p.awaitLookups(c, min(len(p.queue), size)) {
		return // lookedUp dispatches
	}
	b, n, bytes := p.cut(min(len(p.queue), size))
	p.send(c, b, n, bytes)
	p.maybeDispatch(c, false) // cut the next one ahead
}

// maxBatch is the most records a batch takes (PartitionConfig.MaxBatch).
func (p *Partition) maxBatch() int { return max(p.cfg.MaxBatch, p.cfg.BatchSize, 1) }

// ahead is how many batches are cut ahead of the one in flight: cutAhead
// of BatchSize records, fewer of grown ones, at least one.
func (p *Partition) ahead() int { return max(1, cutAhead*max(p.cfg.BatchSize, 1)/p.maxBatch()) }

// cut takes the first n queued records as the batch after the one in
// flight (or the next to apply), decodes them, and starts writing the ones
// that do not decode to the dead-letter topic. It returns the batch and the
// raw records it covers, with their recordBytes.
func (p *Partition) cut(n int) (*applyBatch, int, int64) {
	take := p.queue[:n]
	bytes := messagesBytes(take)
	start := p.state.next
	switch {
	case len(p.ready) > 0:
		start = p.ready[len(p.ready)-1].msg.batch.Next
	case p.inFlight != nil:
		start = p.inFlight.batch.Next
	}
	msg := &applyBatch{batch: processor.Batch{
		Topic:     p.cfg.TP.Topic,
		Partition: p.cfg.TP.Partition,
		Start:     start,
		Next:      int64(take[n-1].TopicPartition.Offset) + 1,
		Records:   make([]processor.Record, 0, n),
	}}
	// The batch's span starts when it is cut: its decoding and its dead
	// letters are part of it. The retry actor ends it with the outcome.
	msg.span = p.cfg.Tracer.StartBatch(p.cfg.TP.Topic, p.cfg.TP.Partition, take)
	var letters []Letter
	recs := msg.batch.Records
	for _, m := range take {
		recs = append(recs, processor.Record{})
		rec := &recs[len(recs)-1]
		err := p.decode(rec, m)
		if err == nil {
			continue
		}
		if !errors.Is(err, ErrSkip) { // skipped: in the batch's offsets, not in its records
			letters = append(letters, Letter{Record: *rec, Reason: err, Attempts: 1, batchStart: start, decoding: true})
		}
		*rec = processor.Record{}
		recs = recs[:len(recs)-1]
	}
	msg.batch.Records = recs
	if len(letters) > 0 {
		// Durable in the DLQ before the batch's transaction begins: the
		// retry actor waits for this delivery. Written before the batch in
		// flight has committed, so a crash or a failed batch may write them
		// again (the DLQ is at-least-once; the offset never passes a record
		// that is in neither place).
		msg.delivery, msg.dead = sendDeadLetters(p.ctx, p.cfg, msg.span, letters)
	}
	// Drop the taken records without copying the rest: clear the slots so
	// the garbage collector can free them, and reslice.
	clear(take)
	p.queue = p.queue[n:]
	p.queueBytes -= bytes
	if len(p.queue) > 0 {
		p.firstAt = time.Now()
	} else {
		// Let the array go: an idle partition keeps nothing, and with
		// a thousand partitions their emptied arrays added up to 15 MB.
		p.queue = nil
	}
	return msg, n, bytes
}

// send hands a cut batch to the retry actor.
func (p *Partition) send(c actor.Context, msg *applyBatch, n int, bytes int64) {
	p.inFlight, p.inFlightN, p.inFlightB = msg, n, bytes
	p.stopTimer()
	c.Send(p.retry, msg)
}

// dropReady forgets the batches cut ahead: their records are re-read after
// a seek, or are the next owner's.
func (p *Partition) dropReady() {
	for _, r := range p.ready {
		p.release(r.n, r.bytes)
		r.msg.span.End(tracing.BatchDropped, nil)
	}
	clear(p.ready)
	p.ready = p.ready[:0]
}

func (p *Partition) batchDone(c actor.Context, msg *batchDone) {
	if p.inFlight == nil || msg.next != p.inFlight.batch.Next {
		return // a reply for an incarnation's batch that no longer exists
	}
	span := p.inFlight.span // ended by the retry actor; still names its trace
	var pe *PanicError
	if errors.As(msg.err, &pe) {
		p.state.panics[msg.start]++
		if p.state.panics[msg.start] < p.cfg.PanicLimit {
			// Let supervision restart this actor (logged and counted by the
			// supervisor); the new incarnation seeks back to the watermark
			// and re-reads the batch, so nothing is skipped. A drain
			// waiting on this batch is answered by Restarting.
			panic(pe)
		}
		p.batchLog(msg.start).Warn("batch keeps panicking; isolating the record", "offset", msg.start,
			"panics", p.state.panics[msg.start], span.LogAttr())
		again := *p.inFlight // its dead letters, if any, are already written
		again.isolatePanics = true
		again.span = p.cfg.Tracer.RestartBatch(span, again.batch.Records)
		c.Send(p.retry, &again)
		return
	}
	n, bytes := p.inFlightN, p.inFlightB
	p.inFlight, p.inFlightN, p.inFlightB = nil, 0, 0
	p.release(n, bytes)
	if msg.err != nil {
		var conflict *store.OffsetConflictError
		if errors.As(msg.err, &conflict) && conflict.Kind != store.Fenced && conflict.StoredEpoch == conflict.Epoch {
			// Still ours, but the batch does not start where the store
			// says. The store is the truth: move the watermark there and
			// read from it again.
			p.cfg.Metrics.Fenced.WithLabelValues(p.cfg.TP.Topic, store.ConflictReason(msg.err)).Inc()
			p.batchLog(msg.start).Warn("batch refused by the offset guard; resuming from the stored offset", "offset", msg.start,
				"stored_offset", conflict.StoredNext, "epoch", p.epoch(), "err", msg.err, span.LogAttr())
			p.state.next = conflict.StoredNext
			p.cfg.Progress.Next.Store(conflict.StoredNext)
			c.Send(p.cfg.Committer, &OffsetMoved{TP: p.cfg.TP, Gen: p.cfg.Gen, Next: conflict.StoredNext})
			p.rewind(c)
			return
		}
		if store.IsOffsetConflict(msg.err) {
			// Another instance claimed the partition: this actor must never
			// write again; the rebalance that follows hands the partition
			// to its owner.
			p.state.fenced = true
			p.cfg.Metrics.Fenced.WithLabelValues(p.cfg.TP.Topic, store.ConflictReason(msg.err)).Inc()
			p.batchLog(msg.start).Error("batch refused by the offset guard; partition stopped", "offset", msg.start,
				"epoch", p.epoch(), "err", msg.err, span.LogAttr())
			p.release(len(p.queue), p.queueBytes)
			p.queue, p.queueBytes = nil, 0
			p.dropReady()
			p.answerDrainers(c)
			return
		}
		if errors.Is(msg.err, context.Canceled) && p.ctx.Err() != nil {
			// This incarnation is ending: the next one, or the next owner,
			// starts from the watermark.
			p.dropReady()
			p.answerDrainers(c)
			return
		}
		// The batch ended neither applied nor dead-lettered (a dead-letter
		// write that failed, an error isolation could not place on a
		// record). Its records and those queued after it are still
		// unapplied: read them again from the watermark, never cut the next
		// batch past them.
		p.batchLog(msg.start).Warn("batch abandoned; reading it again from the watermark", "offset", msg.start,
			"err", msg.err, span.LogAttr())
		p.rewind(c)
		return
	}
	p.log().Debug("batch applied", "offset", msg.start, "next_offset", msg.next, "gen", p.cfg.Gen)
	p.state.next = msg.next
	clear(p.state.panics)
	p.cfg.Progress.Next.Store(msg.next)
	p.cfg.Metrics.StoredOffset.WithLabelValues(p.cfg.TP.Topic, metrics.Partition(p.cfg.TP.Partition)).Set(float64(msg.next))
	c.Send(p.cfg.Committer, &OffsetApplied{TP: p.cfg.TP, Gen: p.cfg.Gen, Next: msg.next, Batch: span.Ref()})
	if len(p.ready) > 0 {
		// Also while draining: their dead letters are written, so applying
		// them keeps them from being written again by the next owner.
		next := p.ready[0]
		p.ready[0] = cutBatch{}
		p.ready = p.ready[1:]
		p.send(c, next.msg, next.n, next.bytes)
		p.maybeDispatch(c, false)
		return
	}
	if p.state.draining {
		p.answerDrainers(c)
		return
	}
	p.maybeDispatch(c, false)
}

// rewind drops everything read after the watermark (state.next) and asks
// the poll loop to fetch from the watermark again; records are ignored
// until the seek is confirmed. A drain waiting is answered: nothing is in
// flight any more.
func (p *Partition) rewind(c actor.Context) {
	p.release(len(p.queue), p.queueBytes)
	p.queue, p.queueBytes = nil, 0
	p.dropReady()
	p.lastQueued = p.state.next
	p.awaitSeek = true
	p.cfg.Seek(c.Self(), p.cfg.TP, p.state.next)
	p.answerDrainers(c)
}

func (p *Partition) answerDrainers(c actor.Context) {
	for _, d := range p.drainers {
		c.Send(d, &Drained{TP: p.cfg.TP, Next: p.state.next})
	}
	p.drainers = nil
}

func (p *Partition) epoch() int64 {
	if p.cfg.Claim == nil {
		return 0
	}
	return p.cfg.Claim.Epoch
}

// release gives back n records of bytes to the partition's count and the
// budget.
func (p *Partition) release(n int, bytes int64) {
	p.cfg.Held.Release(n, bytes)
}

func (p *Partition) armTimer(c actor.Context, d time.Duration) {
	p.stopTimer()
	p.timerSeq++
	seq, self, root := p.timerSeq, c.Self(), c.ActorSystem().Root
	p.timer = time.AfterFunc(d, func() { root.Send(self, &lingerExpired{seq: seq}) })
}

func (p *Partition) stopTimer() {
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	p.timerSeq++
}
