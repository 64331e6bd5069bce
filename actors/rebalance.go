package actors

import (
	"context"
	"fmt"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/internal/store"
	"ratchet/internal/tracing"
)

// rebalance is the consumer's rebalance callback. It runs inside Poll (and
// inside Close) on the poll loop goroutine. Its returned error is ignored by
// the client, so every failure is handled here.
func (s *Supervisor) rebalance(c *kafka.Consumer, ev kafka.Event) error {
	// Close runs this callback on the goroutine that called Close; when
	// Close is abandoned at the stop's deadline the poll loop goes on with
	// the supervisor's state. callbacks keeps the two apart.
	s.callbacks.Lock()
	if s.current.Load() != c {
		// A consumer abandoned after a Close timeout: its callbacks must
		// not touch the state of its successor, nor hold callbacks while
		// librdkafka answers (which may be never).
		s.callbacks.Unlock()
		switch e := ev.(type) {
		case kafka.AssignedPartitions:
			_ = s.incrementalAssign(c, e.Partitions)
		case kafka.RevokedPartitions:
			_ = s.incrementalUnassign(c, e.Partitions)
		}
		return nil
	}
	defer s.callbacks.Unlock()
	// Inside Close, this callback's commits are safe until its librdkafka
	// call (unlocked), and none after it (commitgate.go).
	s.cfg.Commits.openWindow()
	defer s.cfg.Commits.closeWindow(time.Now())
	switch e := ev.(type) {
	case kafka.AssignedPartitions:
		s.assign(c, e.Partitions)
	case kafka.RevokedPartitions:
		s.revoke(c, e.Partitions)
	}
	return nil
}

// unlocked makes call, a librdkafka call that may block, without holding
// callbacks: inside a Close it can wait for good (an incremental unassign
// served while the client terminates: chaos seed 48), and the stop that
// abandons that Close must still be able to retire c (closeConsumer). It
// reports whether c still counts afterwards; when it does not, the
// callback returns at once and touches nothing more of the supervisor's
// state, which belongs to the poll loop again (and perhaps to c's
// successor). Inside a Close, the callback's window for commits shuts
// before call (commitgate.go).
func (s *Supervisor) unlocked(c *kafka.Consumer, call func() error) (still bool, err error) {
	by := s.deadline
	if by.IsZero() {
		by = time.Now().Add(settleAfter)
	}
	if !s.cfg.Commits.closeWindow(by) {
		s.cfg.Logger.Warn("a commit was still on its way to the group at the callback's assign call")
	}
	s.callbacks.Unlock()
	err = call()
	s.callbacks.Lock()
	return s.current.Load() == c, err
}

// assign serves an assign callback: every call completes a rebalance (it
// comes once per rebalance, with an empty list when nothing is added), so
// it also tells the committer that the member has rejoined. While stopping,
// the partitions are parked and whatever is still uncommitted is committed
// here, the moment the group takes commits again (group.go).
func (s *Supervisor) assign(c *kafka.Consumer, parts []kafka.TopicPartition) {
	retired := false // c was retired during a librdkafka call (unlocked)
	defer func() {
		if !retired {
			s.board.phase.CompareAndSwap(int32(PhaseStarting), int32(PhaseRunning))
		}
	}()
	s.assignmentCame(time.Now()) // an empty assignment is an answer too
	defer func() {
		if retired {
			return
		}
		s.rebalances++
		if s.revoked {
			// The assign that closes a cooperative revoke: librdkafka
			// rejoins right after it, and a commit sent now would wait
			// behind that JoinGroup (group.go). The assign that completes
			// the rejoin tells the committer.
			s.revoked = false
			return
		}
		s.system.Root.Send(s.cfg.Committer, &Rejoined{})
	}()
	if s.stopping {
		if retired = !s.park(c, parts); !retired {
			s.commitHeld()
		}
		return
	}
	ctx, cancel := s.claimCtx()
	defer cancel()
	var span tracing.Span // an empty assign (every cooperative rebalance has one) claims nothing
	if len(parts) > 0 {
		span = s.cfg.Tracer.Start("claim", s.trace.Ref())
		span.Int("ratchet.partitions", int64(len(parts)))
	}
	starts := s.startOffsets(ctx, c, parts)
	failed := 0
	for _, st := range starts {
		if st.err != nil {
			failed++
			span.Fail(st.err)
		}
	}
	span.Int("ratchet.claims_failed", int64(failed))
	span.End(nil)
	list := make([]kafka.TopicPartition, 0, len(parts))
	var held []kafka.TopicPartition
	for i, p := range parts {
		tp := TopicPartition{Topic: *p.Topic, Partition: p.Partition}
		st := starts[i]
		if !s.begin(tp, st) {
			// Without a claim this instance must not consume the partition
			// (it could not be fenced). It is assigned, so the group does
			// not give it to anyone else, but held paused, and the claim
			// is retried with backoff (retryClaims), which seeks it to its
			// start. It is assigned at heldAt, not at the stored offset:
			// librdkafka would look that up itself, and when its lookup
			// fails the partition is left in a state every later seek
			// refuses ("Erroneous state"), held for good.
			list = append(list, ktp(tp, heldAt))
			held = append(held, ktp(tp, kafka.OffsetInvalid))
			continue
		}
		list = append(list, ktp(tp, kafka.Offset(st.start))) // an offset: librdkafka looks nothing up
		s.cfg.Logger.Info("partition assigned", "topic", tp.Topic, "partition", tp.Partition,
			"offset", st.start, "epoch", claimEpoch(st.claim))
	}
	still, err := s.unlocked(c, func() error { return s.incrementalAssign(c, list) })
	if !still {
		retired = true
		return
	}
	if err != nil {
		s.cfg.Logger.Error("incremental assign", "err", err)
	}
	if len(held) > 0 {
		if err := c.Pause(held); err != nil {
			s.cfg.Logger.Error("pause unclaimed partitions", "err", err)
		}
	}
	s.cfg.Metrics.Assigned.Set(float64(len(s.parts)))
	s.snapshot()
	if len(s.parts)+len(s.unclaimed) > 0 {
		// A partition held for its claim is this member's as much as a
		// consumed one: the group gave it here, and the member is not idle.
		s.idleSince, s.idleWarned = time.Time{}, false
	} else if s.idleSince.IsZero() {
		s.idleSince = time.Now()
		s.cfg.Logger.Info("no partitions assigned to this instance after a rebalance")
	}
}

// heldAt is the position a held partition is assigned at: an offset, so
// that librdkafka asks the broker nothing for it (a logical offset would
// need an OffsetFetch or a ListOffsets, either of which may be what
// failed). The partition is paused and retryClaims seeks it to its real
// start; whatever is fetched before the pause takes hold is dropped, as
// no partition actor takes it.
const heldAt = kafka.Offset(0)

type startOffset struct {
	start     int64 // where the partition starts: always an offset
	committed int64 // Kafka's committed offset; -1 none
	claim     *store.Claim
	err       error
}

// startOffsets resolves where each newly assigned partition starts: the
// stored offset in exactly-once mode (claiming the partition; a partition
// the store has never seen starts at firstClaim), else Kafka's committed
// offset (-1: Kafka answered that the group has none, auto.offset.reset
// applies). A partition whose committed offset or log bounds could not be
// read gets the error: it is held and retried, never started at
// auto.offset.reset on a guess.
func (s *Supervisor) startOffsets(ctx context.Context, c *kafka.Consumer, parts []kafka.TopicPartition) []startOffset {
	out := make([]startOffset, len(parts))
	if len(parts) == 0 {
		return out
	}
	q := make([]kafka.TopicPartition, len(parts))
	copy(q, parts)
	res, err := c.Committed(q, int(leftOf(ctx)/time.Millisecond))
	committed, errs := committedOffsets(parts, res, err)
	marks := queryWatermarks(c, parts, leftOf(ctx))
	for i := range parts {
		if errs[i] == nil && marks[i].err != nil {
			errs[i] = fmt.Errorf("query watermarks: %w", marks[i].err)
		}
	}
	claims := s.claimAll(ctx, parts, committed, marks, errs)
	for i, p := range parts {
		if errs[i] != nil {
			out[i] = startOffset{err: errs[i]}
			continue
		}
		low, high := marks[i].low, marks[i].high
		if s.cfg.Claim == nil {
			tp := TopicPartition{Topic: *p.Topic, Partition: p.Partition}
			applied, lost := s.lostApplied[tp]
			delete(s.lostApplied, tp)
			pos := resumeAtLeastOnce(committed[i], applied, lost, low, high, s.cfg.AutoOffsetReset)
			if pos.Resumed {
				s.cfg.Logger.Info("partition came back after its assignment was lost; resuming after what this instance applied",
					"topic", tp.Topic, "partition", tp.Partition, "offset", pos.Start, "kafka_committed", committed[i])
			}
			from := committed[i]
			if pos.Resumed {
				from = applied
			}
			s.outside(*p.Topic, p.Partition, from, pos, low, high)
			out[i] = startOffset{start: pos.Start, committed: committed[i]}
			continue
		}
		cl, err := claims[i].claim, claims[i].err
		if err != nil {
			out[i] = startOffset{err: err}
			continue
		}
		if cl.New {
			// The row was created at firstClaim's position: report what
			// that decision found about Kafka's committed offset.
			pos := firstClaim(committed[i], low, high, s.cfg.AutoOffsetReset)
			s.outside(*p.Topic, p.Partition, committed[i], pos, low, high)
			s.cfg.Logger.Info("partition claimed for the first time; starting at the group's committed offset (auto_offset_reset only without one)",
				"topic", *p.Topic, "partition", p.Partition, "offset", cl.Next, "kafka_committed", committed[i],
				"auto_offset_reset", s.cfg.AutoOffsetReset, "epoch", cl.Epoch)
		} else if pos := resumeClaimed(cl.Next, low, high); pos.Start != cl.Next {
			if pos.PastEnd {
				// The log's bounds were read before the claim, which may
				// have waited while the previous owner went on applying
				// (and the producer writing): its last batch can end past
				// that stale end. The claim has fenced it now; read the
				// bounds again before taking the position for a recreated
				// topic, which would apply the whole log again.
				fresh := queryWatermarks(c, []kafka.TopicPartition{p}, leftOf(ctx))[0]
				if fresh.err != nil {
					out[i] = startOffset{err: fmt.Errorf("query watermarks: %w", fresh.err)}
					continue
				}
				low, high = fresh.low, fresh.high
				pos = resumeClaimed(cl.Next, low, high)
			}
			if pos.Start != cl.Next {
				s.outside(*p.Topic, p.Partition, cl.Next, pos, low, high)
				if cl, err = s.cfg.Reposition(ctx, cl, pos.Start); err != nil {
					out[i] = startOffset{err: err}
					continue
				}
			}
		}
		if !cl.New && committed[i] >= 0 && committed[i] != cl.Next {
			// The difference is what Kafka's committed offset alone would
			// have replayed (or skipped): ratchet resumes from the store.
			s.cfg.Metrics.RewindsPrevented.WithLabelValues(*p.Topic).Inc()
			s.cfg.Metrics.RewindRecords.WithLabelValues(*p.Topic).Add(float64(abs(cl.Next - committed[i])))
			s.cfg.Logger.Warn("kafka committed offset differs from the stored offset; resuming from the store",
				"topic", *p.Topic, "partition", p.Partition, "offset", cl.Next, "kafka_committed", committed[i],
				"would_replay", cl.Next-committed[i], "epoch", cl.Epoch)
		}
		claim := cl
		out[i] = startOffset{start: cl.Next, committed: committed[i], claim: &claim}
	}
	return out
}

// outside reports a known position (from) outside the log that pos moved
// to the log start: past the end (pastEnd), or below the start, where
// retention deleted records before this group applied them.
func (s *Supervisor) outside(topic string, partition int32, from int64, pos position, low, high int64) {
	switch {
	case pos.PastEnd:
		s.pastEnd(topic, partition, from, low, high)
	case pos.Deleted > 0:
		s.cfg.Logger.Error("records were deleted by retention before they were applied; starting at the log start",
			"topic", topic, "partition", partition, "offset", from, "log_start", low, "lost", pos.Deleted)
	}
}

// pastEnd reports a position beyond the partition's end: the topic was
// deleted and recreated (or truncated). Every offset from the old log is
// meaningless for the new one; the records in it start at the log start,
// and skipping them would lose them.
func (s *Supervisor) pastEnd(topic string, partition int32, pos, low, high int64) {
	s.cfg.Metrics.OffsetResets.WithLabelValues(topic).Inc()
	s.cfg.Logger.Error("stored position is past the end of the partition (topic recreated or truncated); starting at the log start",
		"topic", topic, "partition", partition, "offset", pos, "end", high, "log_start", low)
}

// revoke serves a revoke callback. Unless the assignment was lost, every
// revoked partition finishes its batch in flight and commits what it
// applied before the callback returns: inside the callback the member
// holds the generation the group has just completed and sends no JoinGroup,
// so the coordinator takes the commit (group.go). A refusal that the group
// resolves by itself (coordinator moving or loading) is retried until the
// drain timeout; the partitions only move to their next owner once this
// callback has returned.
func (s *Supervisor) revoke(c *kafka.Consumer, parts []kafka.TopicPartition) {
	lost := c.AssignmentLost()
	span := s.cfg.Tracer.Start("revoke", s.trace.Ref())
	span.Int("ratchet.partitions", int64(len(parts)))
	span.Bool("ratchet.assignment_lost", lost)
	outer := s.trace
	s.trace = span
	retired := false // c was retired during a librdkafka call (unlocked)
	defer func() {
		span.End(nil)
		if !retired {
			s.trace = outer
		}
	}()
	s.revoked = true
	tps := make([]TopicPartition, 0, len(parts))
	var wasHeld []kafka.TopicPartition
	for _, p := range parts {
		tp := TopicPartition{Topic: *p.Topic, Partition: p.Partition}
		if s.parked[tp] {
			delete(s.parked, tp) // never consumed: nothing to drain or commit
			continue
		}
		if _, ok := s.unclaimed[tp]; ok {
			delete(s.unclaimed, tp) // never consumed either
			s.publishUnclaimed()
			wasHeld = append(wasHeld, ktp(tp, kafka.OffsetInvalid))
			continue
		}
		delete(s.returned, tp)
		tps = append(tps, tp)
	}
	if lost {
		// Another member may own these already: commit nothing. What was
		// applied and not committed is given up, loudly (abandon).
		s.cfg.Logger.Warn("assignment lost; stopping partitions without committing", "partitions", len(tps))
		s.system.Root.Send(s.cfg.Committer, &Forget{TPs: tps})
		s.abandon(tps)
		s.stopPartitions(tps, s.cfg.Claim == nil)
	} else {
		// Bounded by the stop's deadline too, also when the stop is
		// requested during this callback (by).
		deadline := s.by(time.Now().Add(s.cfg.DrainTimeout), stopReserve(s.cfg.DrainTimeout))
		if s.stopping && s.deadline.Before(deadline) {
			deadline = s.deadline
		}
		s.cfg.Logger.Info("partitions revoked: draining and committing", "partitions", len(tps),
			"deadline", time.Until(deadline).Round(time.Millisecond).String())
		s.drain(tps, deadline, false)
		s.commitRevoked(tps, deadline)
		s.stopPartitions(tps, false)
	}
	if len(wasHeld) > 0 {
		// librdkafka keeps a partition's pause across its reassignment
		// (CKG #193): a partition held paused for its claim would come
		// back paused and never be fetched. Give the pause back with it.
		if err := c.Resume(wasHeld); err != nil {
			s.cfg.Logger.Warn("resume held partitions before giving them up", "partitions", len(wasHeld), "err", err)
		}
	}
	still, err := s.unlocked(c, func() error { return s.incrementalUnassign(c, parts) })
	if !still {
		retired = true
		return
	}
	if err != nil {
		s.cfg.Logger.Error("incremental unassign", "err", err)
	}
	if !s.stopping && (lost || len(s.parts)+len(s.unclaimed) == 0) {
		// The member holds nothing now and waits for the group to assign
		// again (assignwait.go).
		since := "revoke"
		if lost {
			since = "assignment lost"
		}
		s.waitForAssignment(time.Now(), since)
	}
	s.cfg.Metrics.Assigned.Set(float64(len(s.parts)))
	s.snapshot()
}

// commitRevoked commits the applied watermarks of revoked partitions and
// then has the committer forget them. It is called inside the revoke
// callback, where the group takes commits (group.go); a refusal is retried
// with a short backoff until deadline, except when the coordinator no longer
// knows this member or its generation: then librdkafka is about to declare
// the assignment lost, and retrying cannot help.
func (s *Supervisor) commitRevoked(tps []TopicPartition, deadline time.Time) {
	for attempt := 0; ; attempt++ {
		f, err := s.flush(tps, false, deadline, s.trace.Ref())
		if err == nil && f.Err == nil && len(f.Pending) == 0 {
			s.cfg.Logger.Info("offsets flushed", "partitions", len(tps), "committed", len(f.Committed))
			break
		}
		reason := "timeout"
		if err == nil {
			reason = commitResult(f.Err, "error")
			err = f.Err
		}
		wait := min(s.cfg.Retry.Backoff(attempt), 500*time.Millisecond)
		deadline = s.by(deadline, stopReserve(s.cfg.DrainTimeout))
		if reason == "group_unknown_member" || reason == "group_generation" || time.Now().Add(wait).After(deadline) {
			s.cfg.Logger.Warn("revoked partitions' offsets not committed", "partitions", len(tps), "reason", reason, "err", err)
			s.trace.Fail(fmt.Errorf("offsets not committed (%s): %w", reason, err))
			s.abandon(tps)
			break
		}
		s.cfg.Logger.Info("commit of revoked partitions refused; retrying", "partitions", len(tps), "reason", reason, "err", err)
		// Inside the rebalance callback nothing else may run on this
		// goroutine meanwhile; a stop requested now cuts the pause short.
		s.await(nil, time.Now().Add(wait), stopReserve(s.cfg.DrainTimeout))
	}
	s.system.Root.Send(s.cfg.Committer, &Forget{TPs: tps})
}

// park takes partitions assigned while the consumer stops: the group
// protocol wants them assigned, and nothing of them is consumed. A partition
// this instance applied records of before its assignment was lost gets
// that position committed, if Kafka's is behind it (group.go, point 4).
// It reports whether c still counts (unlocked).
func (s *Supervisor) park(c *kafka.Consumer, parts []kafka.TopicPartition) bool {
	if len(parts) == 0 {
		return true
	}
	still, err := s.unlocked(c, func() error { return s.incrementalAssign(c, parts) })
	if !still {
		return false
	}
	if err != nil {
		s.cfg.Logger.Error("incremental assign", "err", err)
		return true
	}
	if err := c.Pause(parts); err != nil {
		s.cfg.Logger.Warn("pause parked partitions", "err", err)
	}
	var back []kafka.TopicPartition
	for _, p := range parts {
		tp := TopicPartition{Topic: *p.Topic, Partition: p.Partition}
		s.parked[tp] = true
		if _, ok := s.lostApplied[tp]; ok {
			back = append(back, ktp(tp, kafka.OffsetInvalid))
		}
	}
	s.cfg.Logger.Info("partitions assigned while stopping; not consuming them", "partitions", len(parts))
	if len(back) == 0 {
		return true
	}
	res, err := c.Committed(back, int(max(time.Until(s.deadline), time.Millisecond)/time.Millisecond))
	if err != nil {
		return true
	}
	for _, r := range res {
		tp := TopicPartition{Topic: *r.Topic, Partition: r.Partition}
		applied := s.lostApplied[tp]
		delete(s.lostApplied, tp)
		if r.Error != nil || int64(r.Offset) >= applied {
			continue
		}
		s.gen++
		s.system.Root.Send(s.cfg.Committer, &Register{TP: tp, Gen: s.gen, Start: applied, Committed: int64(r.Offset)})
		delete(s.parked, tp)
		s.returned[tp] = true // committed with the partitions still held
		s.cfg.Logger.Info("partition came back while stopping; committing what this instance applied before losing it",
			"topic", tp.Topic, "partition", tp.Partition, "offset", applied, "kafka_committed", int64(r.Offset))
	}
	return true
}
