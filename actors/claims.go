package actors

import (
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// unclaimed is an assigned partition this instance could not start
// (exactly-once: its claim in the offset store failed; at-least-once: its
// positions could not be read). It stays assigned and paused until a retry
// succeeds.
type unclaimed struct {
	attempt int
	next    time.Time // when to try again
	err     error
}

// spawn starts the partition actor of tp at st and registers it with the
// committer.
func (s *Supervisor) spawn(tp TopicPartition, st startOffset) error {
	s.gen++
	a := &assigned{tp: tp, gen: s.gen, held: NewHeld(s.budget), progress: newProgress(st.start), epoch: claimEpoch(st.claim)}
	a.progress.Committed.Store(st.committed)
	pcfg := &PartitionConfig{
		TP: tp, Gen: a.gen, Start: st.start, Claim: st.claim,
		Format: s.cfg.Format(tp.Topic), NewDecoder: s.cfg.NewDecoder, BatchSize: s.cfg.BatchSize, MaxBatch: s.cfg.MaxBatch, Linger: s.cfg.Linger,
		Retry: s.cfg.Retry, Applier: s.cfg.Applier, Committer: s.cfg.Committer, DLQ: s.cfg.DLQ, DLQTopic: s.cfg.DLQTopic(tp.Topic),
		Held: a.held, Progress: a.progress, Seek: s.requestSeek,
		PanicLimit: max(1, min(s.cfg.Retry.MaxAttempts, s.cfg.MaxRestarts)), Metrics: s.cfg.Metrics, Logger: s.cfg.Logger,
		ResetWatch: s.cfg.ResetWatch, DeadLetterLog: s.cfg.DeadLetterLog, Tracer: s.cfg.Tracer,
		Guard: s.cfg.Guard, RejectWait: s.cfg.RejectWait,
	}
	res, err := s.system.Root.RequestFuture(s.pid, &spawnPartition{cfg: pcfg}, 10*time.Second).Result()
	if err != nil {
		return fmt.Errorf("spawn partition actor: %w", err)
	}
	pid, ok := res.(*actor.PID)
	if !ok {
		return fmt.Errorf("spawn partition actor: %v", res)
	}
	a.pid = pid
	s.parts[tp] = a
	s.system.Root.Send(s.cfg.Committer, &Register{TP: tp, Gen: a.gen, Start: st.start, Committed: st.committed,
		Progress: a.progress})
	return nil
}

// begin starts the partition actor of tp at st, or, when st carries an
// error or the actor cannot be spawned, holds tp as unclaimed (retried
// later). It reports whether the actor started.
func (s *Supervisor) begin(tp TopicPartition, st startOffset) bool {
	err := st.err
	if err == nil {
		err = s.spawn(tp, st)
	}
	if err != nil {
		s.unclaim(tp, err)
		return false
	}
	return true
}

// unclaim records that tp could not be started and schedules a retry.
func (s *Supervisor) unclaim(tp TopicPartition, err error) {
	u, ok := s.unclaimed[tp]
	if !ok {
		u = &unclaimed{}
		s.unclaimed[tp] = u
	}
	u.err = err
	u.next = time.Now().Add(s.cfg.Retry.Backoff(u.attempt))
	u.attempt++
	s.cfg.Logger.Error("cannot claim partition; holding it paused and retrying", "topic", tp.Topic,
		"partition", tp.Partition, "attempt", u.attempt, "retry_in", time.Until(u.next).Round(time.Millisecond).String(),
		"err", err)
	s.publishUnclaimed()
}

// retryClaims retries the claims that are due. It runs on the poll loop.
// A partition claimed now is moved to its start (records fetched before it
// was paused were dropped: the poll loop only hands records to partition
// actors) and resumed.
func (s *Supervisor) retryClaims() {
	if len(s.unclaimed) == 0 || s.stopping || s.consumer == nil {
		return
	}
	now := time.Now()
	var due []kafka.TopicPartition
	for tp, u := range s.unclaimed {
		if !now.Before(u.next) {
			due = append(due, ktp(tp, kafka.OffsetInvalid))
		}
	}
	if len(due) == 0 {
		return
	}
	ctx, cancel := s.claimCtx()
	defer cancel()
	starts := s.startOffsets(ctx, s.consumer, due)
	for i, p := range due {
		tp := TopicPartition{Topic: *p.Topic, Partition: p.Partition}
		st := starts[i]
		if !s.begin(tp, st) {
			continue
		}
		pos := kafka.Offset(st.start) // always an offset: startOffsets resolved auto.offset.reset
		res, err := s.consumer.SeekPartitions([]kafka.TopicPartition{ktp(tp, pos)})
		if err == nil && len(res) == 1 && res[0].Error != nil {
			err = res[0].Error
		}
		if err != nil {
			// The partition actor waits for records that will not come
			// from the right place: stop it and try again later.
			s.stopPartitions([]TopicPartition{tp}, false)
			s.system.Root.Send(s.cfg.Committer, &Forget{TPs: []TopicPartition{tp}})
			s.unclaim(tp, fmt.Errorf("seek to %v: %w", pos, err)) // the next attempt of the same hold
			continue
		}
		delete(s.unclaimed, tp)
		if err := s.consumer.Resume([]kafka.TopicPartition{ktp(tp, kafka.OffsetInvalid)}); err != nil {
			s.cfg.Logger.Warn("resume claimed partition", "topic", tp.Topic, "partition", tp.Partition, "err", err)
		}
		s.cfg.Logger.Info("partition claimed after retrying; consuming it", "topic", tp.Topic, "partition", tp.Partition,
			"offset", st.start, "epoch", claimEpoch(st.claim))
	}
	s.cfg.Metrics.Assigned.Set(float64(len(s.parts)))
	s.publishUnclaimed()
}

// publishUnclaimed exports the unclaimed partitions to the metrics and to
// the board (readiness reports them as degraded).
func (s *Supervisor) publishUnclaimed() {
	s.cfg.Metrics.Unclaimed.Set(float64(len(s.unclaimed)))
	reason := ""
	for tp, u := range s.unclaimed {
		reason = fmt.Sprintf("%s: %v", tp, u.err)
		break
	}
	s.board.setUnclaimed(len(s.unclaimed), reason)
}
