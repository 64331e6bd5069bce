package actors

import (
	"fmt"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/internal/tracing"
)

// TopicPartition names one partition of one topic.
type TopicPartition struct {
	Topic     string
	Partition int32
}

func (tp TopicPartition) String() string { return fmt.Sprintf("%s[%d]", tp.Topic, tp.Partition) }

// Records carries records of one partition, in offset order. Sent by the
// supervisor's poll loop to the partition actor. Seek is the partition's seek
// generation when the poll loop read them; a partition drops records of an
// older generation (they were fetched before a seek it asked for).
type Records struct {
	Seek uint64
	Msgs []*kafka.Message
}

// Drain asks a partition actor to stop starting batches and to report its
// watermark once the batch in flight, if any, is applied (and the batches
// cut ahead of it, whose dead letters are already written). Sent by the poll
// loop on revoke and on stop, with RequestFuture; the reply is *Drained.
type Drain struct{}

// Drained is a partition actor's reply to Drain. Next is the first offset it
// has not applied (-1 when it never saw a record).
type Drained struct {
	TP   TopicPartition
	Next int64
}

// OffsetApplied tells the committer that a partition applied everything
// before Next. Sent by the partition actor after each batch transaction
// committed. Gen is the assignment generation the committer registered the
// partition with; reports of another generation are stale and ignored.
type OffsetApplied struct {
	TP   TopicPartition
	Gen  uint64
	Next int64
	// Batch is the span of the batch that moved the watermark to Next, the
	// commit span's link to it; the zero Ref with tracing off.
	Batch tracing.Ref
}

// Register starts tracking a partition in the committer. Sent by the poll
// loop when the partition is assigned, before any OffsetApplied of that
// generation can exist. Start is the position the assignment starts at (the
// committed offset, or -1 when none is known).
type Register struct {
	TP    TopicPartition
	Gen   uint64
	Start int64
	// Committed is Kafka's committed offset at assignment (-1: none). When
	// Start is ahead of it, the committer commits Start at its next chance.
	Committed int64
	Progress  *Progress // the committer records acknowledged commits here
}

// Flush asks the committer to commit synchronously the watermarks of TPs
// (all partitions when TPs is nil) that are ahead of what Kafka has, and then
// to forget them when Forget is set (revoke). Sent by the poll loop with
// RequestFuture on revoke, reconnect and stop; the reply is *Flushed.
type Flush struct {
	TPs    []TopicPartition
	Forget bool
	// Trace is the span the flush is part of (a stop, a revoke): the
	// commit's span is its child. The zero Ref: a root span, or none.
	Trace tracing.Ref
}

// Flushed is the committer's reply to Flush. Committed holds what was
// committed in this flush; Err is the commit error, if any; Pending lists
// the flushed partitions whose applied watermark Kafka still lacks.
type Flushed struct {
	Committed map[TopicPartition]int64
	Err       error
	Pending   []Uncommitted
}

// Uncommitted is a partition whose applied watermark (Next) is ahead of
// what Kafka acknowledged (Committed; -1 none).
type Uncommitted struct {
	TP        TopicPartition
	Next      int64
	Committed int64
}

// Rejoined tells the committer that the consumer has just completed a
// rebalance (the assign callback ran, so the member holds the group's
// current generation): the moment a commit refused during the rebalance
// succeeds. Sent by the poll loop after every assign callback.
type Rejoined struct{}

// Forget drops partitions from the committer without committing them (the
// assignment was lost: another member may own them already). Sent by the
// poll loop.
type Forget struct {
	TPs []TopicPartition
}

// Seeked tells a restarted partition actor that the poll loop moved the
// partition's fetch position back to its watermark. Records of an older Seek
// generation must be dropped. Sent by the poll loop in answer to a seek
// request.
type Seeked struct {
	Seek uint64
	Next int64
	Err  error
}

// commitTick is the committer's timer message: commit what changed.
type commitTick struct{}

// lingerExpired is a partition's timer message: the oldest buffered record
// has waited batch_linger.
type lingerExpired struct{ seq uint64 }
