package actors

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/internal/metrics"
	"ratchet/internal/tracing"
)

// stopReserve is the part of the stop's budget (DrainTimeout, from the
// moment the stop began) kept for what comes after the commits: Close gets
// the first half of it, the engine's own teardown (dead-letter producer,
// pool) the second.
func stopReserve(budget time.Duration) time.Duration {
	return min(max(budget/5, 500*time.Millisecond), 5*time.Second)
}

// stopClock records when the engine's stop was requested: the moment Run's
// context ended (the signal), whatever the poll loop was doing then (inside
// Poll serving a revoke, in an assign's claims). Every wait on the way out
// counts from that moment, not from when the loop notices.
type stopClock struct {
	mu sync.Mutex
	at time.Time
	ch chan struct{} // closed at the request
}

// mark records the request (the first call only) and returns its time.
func (c *stopClock) mark() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() {
		c.at = time.Now()
		close(c.asked0())
	}
	return c.at
}

// when returns the time of the request; zero before it.
func (c *stopClock) when() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.at
}

// asked is closed when the stop is requested.
func (c *stopClock) asked() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.asked0()
}

func (c *stopClock) asked0() chan struct{} {
	if c.ch == nil {
		c.ch = make(chan struct{})
	}
	return c.ch
}

// by returns deadline, or, once the engine's stop was requested, the moment
// keep before the stop's end (request + DrainTimeout) when that comes
// first. keep is what the steps after the wait still need: stopReserve for
// the drain and the commits, half of it for Close.
func (s *Supervisor) by(deadline time.Time, keep time.Duration) time.Time {
	at := s.clock.when()
	if at.IsZero() {
		return deadline
	}
	return minTime(deadline, at.Add(s.cfg.DrainTimeout-keep))
}

// errStopDeadline ends a wait cut short by the stop's deadline.
var errStopDeadline = errors.New("stop deadline reached")

// await waits for done until deadline (by) with keep kept: a stop
// requested meanwhile brings the deadline forward. It reports whether done
// came. A nil done just waits.
func (s *Supervisor) await(done <-chan struct{}, deadline time.Time, keep time.Duration) bool {
	select {
	case <-done:
		return true // also when the deadline has passed already
	default:
	}
	asked := s.clock.asked()
	for {
		t := time.NewTimer(time.Until(s.by(deadline, keep)))
		select {
		case <-done:
			t.Stop()
			return true
		case <-t.C:
			select {
			case <-done:
				return true
			default:
				return false
			}
		case <-asked:
			t.Stop()
			asked = nil // the deadline may have come forward; once is enough
		}
	}
}

// claimCtx bounds the claims and position lookups of an assignment: they
// end after DrainTimeout, or at the stop's drain deadline once the
// engine's stop is requested, also during them (a claim waiting on a row
// lock must not hold the stop). A claim cut short leaves its partition
// held and retried, never placed by default.
func (s *Supervisor) claimCtx() (context.Context, context.CancelFunc) {
	keep := stopReserve(s.cfg.DrainTimeout)
	deadline := time.Now().Add(s.cfg.DrainTimeout)
	ctx, cancel := context.WithDeadline(context.Background(), s.by(deadline, keep))
	asked := s.clock.asked()
	go func() { // ends with ctx
		select {
		case <-ctx.Done():
		case <-asked:
			t := time.NewTimer(time.Until(s.by(deadline, keep)))
			defer t.Stop()
			select {
			case <-ctx.Done():
			case <-t.C:
				cancel()
			}
		}
	}()
	return ctx, cancel
}

// leftOf is what is left of ctx's deadline (claimCtx), at least a
// millisecond: the timeout of a blocking client call made under it.
func leftOf(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return max(time.Until(d), time.Millisecond)
	}
	return time.Minute
}

// stopActor stops the supervisor actor (and so what is left of its
// children), waiting for it no longer than the stop's end allows.
func (s *Supervisor) stopActor(pid *actor.PID) {
	f := s.system.Root.StopFuture(pid)
	done := make(chan struct{})
	go func() { _ = f.Wait(); close(done) }() // ends by the future's own timeout
	s.await(done, time.Now().Add(10*time.Second), stopReserve(s.cfg.DrainTimeout)/4)
}

// stop is the graceful end of a consumer, for a stop of the engine or a
// rebuild of the consumer. It keeps serving the group protocol throughout
// (group.go explains why): every partition is paused and what is fetched
// is dropped, the partition actors finish their batches in flight while the
// loop polls, then the applied watermarks are committed, again while
// polling, and a commit the group refuses is made again at the next
// rebalance callback. Only the deadline abandons a commit. The consumer is
// closed last, within what is left of the budget. began is when the stop
// was requested (the signal, for the engine's stop); a stop requested
// during a rebuild's brings every deadline forward (by).
func (s *Supervisor) stop(began time.Time) {
	reserve := stopReserve(s.cfg.DrainTimeout)
	s.stopping, s.leftCommitted = true, false
	s.deadline = s.by(began.Add(s.cfg.DrainTimeout-reserve), reserve)
	defer func() {
		s.stopping, s.deadline = false, time.Time{}
		clear(s.parked)
		clear(s.returned)
		clear(s.unclaimed) // the next consumer, if any, starts afresh
		clear(s.abandoned)
		s.publishUnclaimed()
	}()
	tps := s.heldTPs()
	span := s.cfg.Tracer.Start("stop", s.trace.Ref())
	span.Int("ratchet.partitions", int64(len(tps)))
	outer := s.trace
	s.trace = span
	defer func() {
		span.Bool("ratchet.committed", s.leftCommitted)
		if !s.leftCommitted && len(tps) > 0 {
			span.Fail(errors.New("offsets not committed before leaving"))
		}
		span.End(nil)
		s.trace = outer
	}()
	s.cfg.Logger.Info("stopping: draining partitions", "partitions", len(tps), span.LogAttr())
	s.pauseAll()
	s.drain(tps, s.deadline, true)
	span.Event("drained")
	s.commitBeforeLeaving()
	span.Event("commit ended")
	// Close runs the revoke callback once more; it finds everything drained
	// and committed, and may use the time Close has.
	s.deadline = s.by(began.Add(s.cfg.DrainTimeout-reserve/2), reserve/2)
	s.leave()
	s.closeConsumer(s.deadline)
	// The committer forgets every partition of this consumer: a commit of
	// one of them through the next consumer (after a rebuild) could move
	// the offset of a partition another member owns by then.
	held := s.heldTPs()
	s.stopPartitions(held, false)
	s.system.Root.Send(s.cfg.Committer, &Forget{TPs: held})
}

// heldTPs lists the partitions whose applied watermarks are this
// consumer's to commit.
func (s *Supervisor) heldTPs() []TopicPartition {
	tps := make([]TopicPartition, 0, len(s.parts)+len(s.returned))
	for tp := range s.parts {
		tps = append(tps, tp)
	}
	for tp := range s.returned {
		tps = append(tps, tp)
	}
	return tps
}

// pauseAll pauses every assigned partition and drops the records read but
// not yet handed over: from now on nothing new is applied.
func (s *Supervisor) pauseAll() {
	list := make([]kafka.TopicPartition, 0, len(s.parts))
	for tp, a := range s.parts {
		a.pending = nil
		if a.paused {
			continue
		}
		a.paused = true
		s.cfg.Metrics.Paused.Inc()
		list = append(list, ktp(tp, kafka.OffsetInvalid))
	}
	if len(list) == 0 || s.consumer == nil {
		return
	}
	if err := s.consumer.Pause(list); err != nil {
		// The records still arrive, and are dropped (handle).
		s.cfg.Logger.Warn("pause partitions for the stop", "err", err)
	}
}

// drain lets every partition in tps finish its batch in flight (and the
// batches cut ahead, whose dead letters are written), until deadline. With
// polling the loop keeps serving the group protocol meanwhile; without (in
// a rebalance callback) it waits.
func (s *Supervisor) drain(tps []TopicPartition, deadline time.Time, polling bool) {
	var wg sync.WaitGroup
	for _, tp := range tps {
		a, ok := s.parts[tp]
		if !ok {
			continue
		}
		f := s.system.Root.RequestFuture(a.pid, &Drain{}, max(time.Until(s.by(deadline, stopReserve(s.cfg.DrainTimeout))), time.Millisecond))
		wg.Go(func() { // ends when the future completes (answer or timeout)
			res, err := f.Result()
			if err != nil {
				s.cfg.Logger.Warn("drain partition", "topic", tp.Topic, "partition", tp.Partition, "err", err)
				return
			}
			if d, ok := res.(*Drained); ok {
				s.cfg.Logger.Debug("partition drained", "topic", tp.Topic, "partition", tp.Partition, "offset", d.Next)
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }() // ends with the futures, which end by the deadline
	if !polling {
		// In a rebalance callback: a stop requested meanwhile brings the
		// deadline forward (the futures left behind end by theirs).
		s.await(done, deadline, stopReserve(s.cfg.DrainTimeout))
		return
	}
	s.pollUntil(deadline, func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	})
}

// flush asks the committer to commit tps synchronously and waits for the
// answer until deadline, or the stop's (by), whichever comes first: the
// committer may be inside a commit to a broker that does not answer.
func (s *Supervisor) flush(tps []TopicPartition, forget bool, deadline time.Time, parent tracing.Ref) (*Flushed, error) {
	keep := stopReserve(s.cfg.DrainTimeout)
	f := s.system.Root.RequestFuture(s.cfg.Committer, &Flush{TPs: tps, Forget: forget, Trace: parent},
		max(time.Until(s.by(deadline, keep)), time.Millisecond))
	var (
		res  any
		err  error
		done = make(chan struct{})
	)
	go func() { res, err = f.Result(); close(done) }() // ends when the future does: by its timeout
	if !s.await(done, deadline, keep) {
		return nil, fmt.Errorf("flush offsets: %w", errStopDeadline)
	}
	if err != nil {
		return nil, fmt.Errorf("flush offsets: %w", err)
	}
	return res.(*Flushed), nil
}

// commitHeld commits, from inside an assign callback during a stop, what
// the held partitions applied: the callback is the moment the group takes
// commits again after refusing them (group.go).
func (s *Supervisor) commitHeld() {
	if s.leftCommitted {
		return
	}
	tps := s.heldTPs()
	f, err := s.flush(tps, false, s.deadline, s.trace.Ref())
	if err != nil {
		s.cfg.Logger.Info("commit after the rebalance did not answer in time", "err", err)
		return
	}
	if f.Err == nil && len(f.Pending) == 0 {
		s.leftCommitted = true
		s.cfg.Logger.Info("offsets flushed", "partitions", len(tps), "committed", len(f.Committed))
		return
	}
	s.cfg.Logger.Info("commit after the rebalance refused", "reason", commitResult(f.Err, "error"), "err", f.Err)
}

// commitBeforeLeaving commits the held partitions' watermarks while the
// loop keeps polling. When the group refuses (group.go), the loop polls on
// until the next assign callback, which commits again (commitHeld); other
// errors are retried after a short pause. At the deadline every partition
// still uncommitted is abandoned, loudly.
func (s *Supervisor) commitBeforeLeaving() {
	for attempt := 0; !s.leftCommitted; attempt++ {
		if s.fatal {
			// A fatally failed consumer commits nothing more (PITFALLS A6).
			s.abandon(s.heldTPs())
			return
		}
		tps := s.heldTPs()
		var (
			res  *Flushed
			err  error
			done = make(chan struct{})
		)
		// The goroutine may outlive this step, and stop moves s.deadline on.
		deadline, parent := s.deadline, s.trace.Ref()
		go func() { res, err = s.flush(tps, false, deadline, parent); close(done) }() // ends by the deadline
		answered := s.pollUntil(s.deadline, func() bool {
			select {
			case <-done:
				return true
			default:
				return s.leftCommitted
			}
		})
		if !answered {
			break
		}
		if s.leftCommitted {
			<-done // the assign callback committed; this answer is moot
			return
		}
		if err == nil && res.Err == nil && len(res.Pending) == 0 {
			s.leftCommitted = true
			s.cfg.Logger.Info("offsets flushed", "partitions", len(tps), "committed", len(res.Committed))
			return
		}
		if err == nil {
			err = res.Err
		}
		reason := GroupRefusal(err)
		if reason == "" {
			// Not the group: a timeout or a broker that is away. Poll a
			// moment (librdkafka reconnects by itself) and try again.
			s.cfg.Logger.Info("commit before leaving failed; retrying", "err", err)
			s.pollUntil(minTime(s.deadline, time.Now().Add(s.cfg.Retry.Backoff(attempt))), func() bool { return s.leftCommitted })
			continue
		}
		s.cfg.Logger.Info("commit before leaving refused while the group rebalances; committing again once rejoined",
			"reason", reason, "err", err)
		// The next assign callback commits (commitHeld). A refusal that no
		// rebalance follows (the coordinator moving) is retried after a
		// second.
		before := s.rebalances
		s.pollUntil(minTime(s.deadline, time.Now().Add(time.Second)), func() bool {
			return s.leftCommitted || s.rebalances != before
		})
	}
	if !s.leftCommitted {
		s.abandon(s.heldTPs())
	}
}

// leave makes a dynamic member leave the group before Close. A cooperative
// member whose assignment is empty closes without sending LeaveGroup
// (librdkafka 2.11.1: the terminate path revokes nothing, so it never
// reaches the "leave when unassigned" step); the group then waits a whole
// session timeout for it before any rebalance can complete, and every other
// member's commits wait behind their JoinGroups meanwhile. Unsubscribe
// takes the other path: with nothing assigned it leaves at once, otherwise
// it revokes (the callback finds everything committed) and then leaves.
// Static members do not leave: their successor takes their place.
func (s *Supervisor) leave() {
	if s.cfg.InstanceID != "" || s.consumer == nil || s.fatal {
		return
	}
	if err := s.consumer.Unsubscribe(); err != nil {
		s.cfg.Logger.Warn("unsubscribe before close", "err", err)
	}
}

// pollUntil polls, serving rebalance callbacks and dropping records, until
// done returns true (then it returns true) or deadline passes (false).
func (s *Supervisor) pollUntil(deadline time.Time, done func() bool) bool {
	for {
		if done() {
			return true
		}
		left := time.Until(s.by(deadline, stopReserve(s.cfg.DrainTimeout)))
		if left <= 0 || s.consumer == nil {
			return false
		}
		_, _ = s.handle(s.consumer.Poll(int(min(left, 20*time.Millisecond) / time.Millisecond)))
	}
}

// abandon gives up committing tps: one error line per partition whose
// applied watermark Kafka lacks, and the metrics. In at-least-once mode the
// next owner replays those records; in exactly-once mode the store still
// guards them and the next owner resumes from it.
func (s *Supervisor) abandon(tps []TopicPartition) {
	for _, tp := range tps {
		a, ok := s.parts[tp]
		if !ok {
			continue
		}
		next, committed := a.progress.Next.Load(), a.progress.Committed.Load()
		if next < 0 || next <= committed {
			continue
		}
		if at, ok := s.abandoned[tp]; ok && at == next {
			continue // reported already (a stop, then the revoke inside its Close)
		}
		if s.abandoned == nil {
			s.abandoned = make(map[TopicPartition]int64)
		}
		s.abandoned[tp] = next
		records := next - max(committed, 0)
		s.cfg.Metrics.CommitsAbandoned.WithLabelValues(tp.Topic).Inc()
		s.cfg.Metrics.UncommittedRecords.WithLabelValues(tp.Topic).Add(float64(records))
		if s.cfg.Claim == nil {
			s.cfg.Logger.Error("applied offsets left uncommitted; the next owner replays them",
				"topic", tp.Topic, "partition", tp.Partition, "offset", next, "kafka_committed", committed,
				"replay", records)
			continue
		}
		s.cfg.Logger.Error("applied offsets left uncommitted in Kafka; the offset store still guards them",
			"topic", tp.Topic, "partition", tp.Partition, "offset", next, "kafka_committed", committed,
			"guarded", records, "epoch", a.epoch)
	}
}

// stopPartitions stops the actors of tps and forgets them. With remember
// (at-least-once, assignment lost) their applied watermarks are kept in
// case the partitions come back. It waits for the actors to stop (a
// processor that ignores its context can hold one) for DrainTimeout at
// most, and no longer than the stop's Close phase allows.
func (s *Supervisor) stopPartitions(tps []TopicPartition, remember bool) {
	until := time.Now().Add(s.cfg.DrainTimeout)
	var wg sync.WaitGroup
	stopped := make([]*assigned, 0, len(tps))
	var resume []kafka.TopicPartition
	for _, tp := range tps {
		a, ok := s.parts[tp]
		if !ok {
			continue
		}
		if a.paused {
			s.cfg.Metrics.Paused.Dec()
			resume = append(resume, ktp(tp, kafka.OffsetInvalid)) // else still paused if assigned again (CKG #193)
		}
		// Another member exports this partition's lag from now on.
		s.cfg.Metrics.Lag.DeleteLabelValues(tp.Topic, metrics.Partition(tp.Partition))
		delete(s.parts, tp)
		stopped = append(stopped, a)
		f := s.system.Root.StopFuture(a.pid)
		wg.Go(func() { _ = f.Wait() }) // ends by the future's own timeout
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }() // ends with the futures
	if !s.await(done, until, stopReserve(s.cfg.DrainTimeout)/2) && len(stopped) > 0 {
		s.cfg.Logger.Warn("partition actors still stopping at the deadline; going on without them", "partitions", len(stopped))
	}
	// The accounts end even when an actor is still stopping at the
	// deadline: what it gives back later counts nothing (budget.go).
	s.pauseResume(nil, resume)
	for _, a := range stopped {
		a.held.End() // what its mailbox still held, a Stop dropped unseen (budget.go)
	}
	if !remember {
		return
	}
	for _, a := range stopped {
		if next := a.progress.Next.Load(); next >= 0 {
			s.lostApplied[a.tp] = next
		}
	}
}

// closeConsumer closes the consumer, giving up at deadline (brought
// forward by a stop requested meanwhile): Close blocks forever after some
// fatal errors (PITFALLS A6). Close runs the rebalance callback (revoke) on
// its goroutine; the partitions are drained and committed by then, so it
// only unassigns. The idle check's metadata request must end before Close
// (the handle is destroyed under it); it waits on Close's goroutine, inside
// the same deadline.
func (s *Supervisor) closeConsumer(deadline time.Time) {
	c := s.consumer
	if c == nil {
		return
	}
	keep := stopReserve(s.cfg.DrainTimeout) / 2
	if s.clock.when().IsZero() {
		deadline = maxTime(deadline, time.Now().Add(100*time.Millisecond)) // a rebuild: Close gets a moment at least
	}
	if !s.cfg.Commits.beginClose(minTime(deadline, time.Now().Add(keep))) {
		s.cfg.Logger.Warn("a commit was still on its way to the group when Close began")
	}
	var err error
	done := make(chan struct{})
	go func() { s.groupCheck.Wait(); err = c.Close(); close(done) }() // ends when Close returns; abandoned on timeout
	began := time.Now()
	if s.await(done, deadline, keep) {
		if err != nil {
			s.cfg.Logger.Warn("close consumer", "err", err)
		}
	} else {
		s.cfg.Logger.Error("close consumer timed out; abandoning it", "timeout", time.Since(began).Round(time.Millisecond).String())
	}
	s.retire(keep)
	s.cfg.Commits.shut()
	s.consumer = nil
}

// retire makes the callbacks of the consumer being closed touch nothing
// from now on. A callback still running inside an abandoned Close holds
// callbacks only between librdkafka calls (unlocked), for waits bounded by
// the stop's deadline, so the lock comes within keep of now; should it
// not, the consumer is retired without it: the callback, still counting on
// the lock, finds the consumer retired after its next librdkafka call, and
// gives the lock back when it ends.
func (s *Supervisor) retire(keep time.Duration) {
	locked := make(chan struct{})
	go func() { s.callbacks.Lock(); close(locked) }() // ends when the callback gives the lock back
	if s.await(locked, time.Now().Add(keep), keep/2) {
		s.current.Store(nil)
		s.callbacks.Unlock()
		return
	}
	s.current.Store(nil)
	s.cfg.Logger.Error("a rebalance callback of the abandoned consumer still holds the supervisor; going on without it")
	go func() { <-locked; s.callbacks.Unlock() }()
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
