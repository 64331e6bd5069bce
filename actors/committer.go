package actors

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/internal/metrics"
	"ratchet/internal/tracing"
)

// OffsetCommitter commits explicit offsets to Kafka. *kafka.Consumer
// implements it. CommitOffsets blocks until the broker answered (it has no
// timeout of its own: socket.timeout.ms bounds it) and may return a nil
// error while single partitions carry one.
type OffsetCommitter interface {
	CommitOffsets(offsets []kafka.TopicPartition) ([]kafka.TopicPartition, error)
}

// CommitterConfig configures a Committer.
type CommitterConfig struct {
	// Kafka returns the consumer to commit through (the engine's
	// CommitGate). It is a function because the consumer is rebuilt on
	// reconnect; it may return nil while there is none.
	Kafka    func() OffsetCommitter
	Interval time.Duration
	Metrics  *metrics.Metrics
	Logger   *slog.Logger
	// Tracer makes a span of every commit; nil: off.
	Tracer *tracing.Tracer
}

// Committer keeps the highest applied watermark of every assigned partition
// and commits the changed ones to Kafka in one request per Interval, however
// many records were applied: the commit load does not grow with the message
// rate. Flush commits synchronously (revoke, reconnect, stop).
//
// A watermark only moves forward: a report lower than the known one is
// ignored and counted, so a late message can never rewind the group.
type Committer struct {
	cfg        CommitterConfig
	parts      map[TopicPartition]*commitState
	timer      *time.Timer
	timerArmed bool
	// awaitRejoin is set when a periodic commit was refused for a group
	// reason (the group is rebalancing): the next Rejoined commits at
	// once instead of a whole Interval later.
	awaitRejoin bool
}

type commitState struct {
	gen       uint64
	next      int64 // highest applied watermark reported
	committed int64 // last watermark Kafka acknowledged
	progress  *Progress
	batch     tracing.Ref // span of the batch that moved next there
}

// NewCommitter returns the committer actor's producer.
func NewCommitter(cfg CommitterConfig) actor.Producer {
	return func() actor.Actor {
		return &Committer{cfg: cfg, parts: make(map[TopicPartition]*commitState)}
	}
}

// Receive implements actor.Actor.
func (m *Committer) Receive(c actor.Context) {
	switch msg := c.Message().(type) {
	case *Register:
		st := &commitState{gen: msg.Gen, next: msg.Start, committed: msg.Committed, progress: msg.Progress}
		m.parts[msg.TP] = st
		if st.next > st.committed && st.next >= 0 {
			// Kafka is behind the position this assignment starts at (the
			// store's, or what this instance applied before it lost the
			// partition): bring it up to date with the next commit.
			m.arm(c)
		}
	case *OffsetApplied:
		st, ok := m.parts[msg.TP]
		if !ok || st.gen != msg.Gen || msg.Next <= st.next {
			if ok && st.gen == msg.Gen && msg.Next < st.next {
				m.cfg.Metrics.StaleOffsets.Inc()
			}
			return
		}
		st.next = msg.Next
		st.batch = msg.Batch
		m.arm(c)
	case *OffsetMoved:
		m.moved(c, msg)
	case *commitTick:
		m.timerArmed = false
		m.periodic(c)
	case *Rejoined:
		if m.awaitRejoin {
			m.periodic(c)
		}
	case *Flush:
		done, err := m.commit(msg.TPs, msg.Trace)
		reply := &Flushed{Committed: done, Err: err, Pending: m.pending(msg.TPs)}
		if msg.Forget {
			for _, tp := range msg.TPs {
				delete(m.parts, tp)
			}
		}
		c.Respond(reply)
	case *Forget:
		for _, tp := range msg.TPs {
			delete(m.parts, tp)
		}
	case *actor.Stopping:
		if m.timer != nil {
			m.timer.Stop()
		}
	}
}

// periodic commits everything ahead of Kafka. A commit refused because the
// group is rebalancing is not worth a warning: it happens at nearly every
// membership change, and it is retried as soon as this member has rejoined
// (Rejoined), or after Interval if no rebalance completes by then.
func (m *Committer) periodic(c actor.Context) {
	_, err := m.commit(nil, tracing.Ref{})
	m.awaitRejoin = false
	if err == nil {
		return
	}
	if errors.Is(err, ErrNoConsumer) || errors.Is(err, ErrConsumerClosing) {
		// Between consumers, or one being closed: the next consumer's
		// assignment registers its partitions afresh.
		m.cfg.Logger.Debug("offset commit deferred: no consumer to commit through", "actor", "committer", "err", err)
	} else if reason := GroupRefusal(err); reason != "" {
		m.awaitRejoin = true
		m.cfg.Logger.Debug("offset commit refused while the group rebalances; retrying once rejoined",
			"actor", "committer", "reason", reason, "err", err)
	} else {
		m.cfg.Logger.Warn("offset commit failed, retrying next interval", "actor", "committer", "err", err)
	}
	m.arm(c)
}

// pending lists the partitions of tps (all when nil) whose applied
// watermark Kafka has not acknowledged.
func (m *Committer) pending(tps []TopicPartition) []Uncommitted {
	var out []Uncommitted
	add := func(tp TopicPartition, st *commitState) {
		if st.next > st.committed && st.next >= 0 {
			out = append(out, Uncommitted{TP: tp, Next: st.next, Committed: st.committed})
		}
	}
	if tps == nil {
		for tp, st := range m.parts {
			add(tp, st)
		}
		return out
	}
	for _, tp := range tps {
		if st, ok := m.parts[tp]; ok {
			add(tp, st)
		}
	}
	return out
}

// arm schedules one commitTick after Interval unless one is pending. This is
// what coalesces commits: however many OffsetApplied arrive meanwhile, they
// become one request.
func (m *Committer) arm(c actor.Context) {
	if m.timerArmed {
		return
	}
	m.timerArmed = true
	self, root := c.Self(), c.ActorSystem().Root
	m.timer = time.AfterFunc(m.cfg.Interval, func() { root.Send(self, &commitTick{}) })
}

// commit commits the watermarks of tps (all when nil) that are ahead of
// Kafka, in one request, and returns what was committed. With tracing the
// commit is a span, a child of parent (a flush's stop or revoke) or a root,
// linking to the batch that moved each committed partition's watermark.
func (m *Committer) commit(tps []TopicPartition, parent tracing.Ref) (map[TopicPartition]int64, error) {
	var offsets []kafka.TopicPartition
	var batches []tracing.Ref
	add := func(tp TopicPartition, st *commitState) {
		if st.next > st.committed && st.next >= 0 {
			topic := tp.Topic
			offsets = append(offsets, kafka.TopicPartition{Topic: &topic, Partition: tp.Partition, Offset: kafka.Offset(st.next)})
			if m.cfg.Tracer != nil {
				batches = append(batches, st.batch)
			}
		}
	}
	if tps == nil {
		for tp, st := range m.parts {
			add(tp, st)
		}
	} else {
		for _, tp := range tps {
			if st, ok := m.parts[tp]; ok {
				add(tp, st)
			}
		}
	}
	if len(offsets) == 0 {
		return nil, nil
	}
	span := m.cfg.Tracer.StartCommit(parent, len(offsets), batches)
	done, err := m.commitOffsets(offsets)
	span.Int("ratchet.commit.committed", int64(len(done)))
	span.End(err)
	return done, err
}

// commitOffsets commits offsets in one request.
func (m *Committer) commitOffsets(offsets []kafka.TopicPartition) (map[TopicPartition]int64, error) {
	var (
		res []kafka.TopicPartition
		err = ErrNoConsumer
	)
	if k := m.cfg.Kafka(); k != nil {
		res, err = k.CommitOffsets(offsets)
	}
	if err != nil {
		m.cfg.Metrics.Commits.WithLabelValues(commitResult(err, "error")).Inc()
		return nil, fmt.Errorf("commit %d partitions: %w", len(offsets), err)
	}
	done := make(map[TopicPartition]int64, len(res))
	var errs []error
	for _, r := range res {
		tp := TopicPartition{Topic: *r.Topic, Partition: r.Partition}
		if r.Error != nil {
			errs = append(errs, fmt.Errorf("commit %s: %w", tp, r.Error))
			continue
		}
		if st, ok := m.parts[tp]; ok && int64(r.Offset) > st.committed {
			st.committed = int64(r.Offset)
			if st.progress != nil {
				st.progress.Committed.Store(st.committed)
			}
		}
		done[tp] = int64(r.Offset)
		m.cfg.Metrics.CommittedOffset.WithLabelValues(tp.Topic, metrics.Partition(tp.Partition)).Set(float64(r.Offset))
	}
	if len(errs) > 0 {
		err := errors.Join(errs...)
		m.cfg.Metrics.Commits.WithLabelValues(commitResult(err, "partial")).Inc()
		return done, err
	}
	m.cfg.Metrics.Commits.WithLabelValues("ok").Inc()
	return done, nil
}
