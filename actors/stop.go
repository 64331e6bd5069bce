package actors

import (
	"fmt"
	"sync"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/internal/metrics"
)

// stopReserve is the part of the stop's budget (DrainTimeout, from the
// moment the stop began) kept for what comes after the commits: Close gets
// the first half of it, the engine's own teardown (dead-letter producer,
// pool) the second.
func stopReserve(budget time.Duration) time.Duration {
	return min(max(budget/5, 500*time.Millisecond), 5*time.Second)
}

// stop is the graceful end of a consumer, for a stop of the engine or a
// rebuild of the consumer. It keeps serving the group protocol throughout
// (group.go explains why): every partition is paused and what is fetched
// is dropped, the partition actors finish their batches in flight while the
// loop polls, then the applied watermarks are committed, again while
// polling, and a commit the group refuses is made again at the next
// rebalance callback. Only the deadline abandons a commit. The consumer is
// closed last, within what is left of the budget.
func (s *Supervisor) stop(began time.Time) {
	reserve := stopReserve(s.cfg.DrainTimeout)
	s.stopping, s.leftCommitted = true, false
	s.deadline = began.Add(s.cfg.DrainTimeout - reserve)
	defer func() {
		s.stopping, s.deadline = false, time.Time{}
		clear(s.parked)
		clear(s.returned)
		clear(s.unclaimed) // the next consumer, if any, starts afresh
		s.publishUnclaimed()
	}()
	tps := s.heldTPs()
	s.cfg.Logger.Info("stopping: draining partitions", "partitions", len(tps))
	s.pauseAll()
	s.drain(tps, s.deadline, true)
	s.commitBeforeLeaving()
	// Close runs the revoke callback once more; it finds everything drained
	// and committed, and may use the time Close has.
	s.deadline = began.Add(s.cfg.DrainTimeout - reserve/2)
	s.leave()
	s.closeConsumer(s.deadline)
	s.stopPartitions(s.heldTPs(), false)
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
		f := s.system.Root.RequestFuture(a.pid, &Drain{}, max(time.Until(deadline), time.Millisecond))
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
	if !polling {
		wg.Wait()
		return
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }() // ends with the futures, which end by the deadline
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
// answer until deadline.
func (s *Supervisor) flush(tps []TopicPartition, forget bool, deadline time.Time) (*Flushed, error) {
	res, err := s.system.Root.RequestFuture(s.cfg.Committer, &Flush{TPs: tps, Forget: forget},
		max(time.Until(deadline), time.Millisecond)).Result()
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
	f, err := s.flush(tps, false, s.deadline)
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
		go func() { res, err = s.flush(tps, false, s.deadline); close(done) }() // ends by the deadline
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
		left := time.Until(deadline)
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
// case the partitions come back.
func (s *Supervisor) stopPartitions(tps []TopicPartition, remember bool) {
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
		wg.Go(func() { _ = s.system.Root.StopFuture(a.pid).Wait() })
	}
	wg.Wait()
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

// closeConsumer closes the consumer, giving up at deadline: Close blocks
// forever after some fatal errors (PITFALLS A6). Close runs the rebalance
// callback (revoke) on this goroutine; the partitions are drained and
// committed by then, so it only unassigns.
func (s *Supervisor) closeConsumer(deadline time.Time) {
	c := s.consumer
	if c == nil {
		return
	}
	s.groupCheck.Wait()
	timeout := max(time.Until(deadline), 100*time.Millisecond)
	done := make(chan error, 1)
	go func() { done <- c.Close() }() // ends when Close returns; abandoned on timeout
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case err := <-done:
		if err != nil {
			s.cfg.Logger.Warn("close consumer", "err", err)
		}
	case <-t.C:
		s.cfg.Logger.Error("close consumer timed out; abandoning it", "timeout", timeout.Round(time.Millisecond).String())
	}
	// A callback still running inside the abandoned Close ends by the
	// stop's deadline; after this, callbacks of c touch nothing.
	s.callbacks.Lock()
	s.current.Store(nil)
	s.callbacks.Unlock()
	s.consumer = nil
	s.cfg.OnConsumer(nil)
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
