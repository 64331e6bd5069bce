package actors

import (
	"fmt"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// Where a newly assigned partition starts. The I/O (Kafka's committed
// offset, the log's bounds, the claim) happens in startOffsets; the
// decisions are here, pure, so that each case has a row in a table test.
//
// One rule runs through them: auto.offset.reset applies only when Kafka
// answered that the group has no committed offset for the partition. A
// lookup that failed is not that answer: the partition is held paused and
// the lookup retried (retryClaims), never placed at the reset position. A
// position outside the log (topic recreated, or records deleted by
// retention) starts at the log start: a fetch from outside the log would
// have librdkafka apply auto.offset.reset, which with "latest" skips every
// record the log still holds.

// position is where a partition starts and what that decision found.
type position struct {
	// Start is the first offset to apply; -1 when none is known (Kafka
	// answered that the group has no committed offset: auto.offset.reset
	// applies).
	Start int64
	// PastEnd: the known position was beyond the log end (the topic was
	// deleted and recreated, or truncated); Start is the log start.
	PastEnd bool
	// Resumed: at-least-once, Start is what this instance applied before it
	// lost the partition, ahead of Kafka's committed offset.
	Resumed bool
	// Deleted counts the records between the known position and the log
	// start that retention deleted before they were applied; Start is the
	// log start.
	Deleted int64
}

// clamp moves a known position outside the log [low, high] to the log
// start, recording why. An unknown position (-1) is left to
// auto.offset.reset.
func (p position) clamp(low, high int64) position {
	switch {
	case p.Start < 0:
	case p.Start > high:
		p.Start, p.PastEnd = low, true
	case p.Start < low:
		p.Start, p.Deleted = low, low-p.Start
	}
	return p
}

// committedOffsets reads the answer of a committed-offset lookup
// (Consumer.Committed) for parts: each partition's committed offset, -1
// when Kafka answered that the group has none, or why it is unknown: the
// error of the whole call, the partition's own error, or its absence from
// the answer. Only -1 may lead to auto.offset.reset; an error must not.
func committedOffsets(parts, res []kafka.TopicPartition, err error) ([]int64, []error) {
	offs := make([]int64, len(parts))
	errs := make([]error, len(parts))
	byTP := make(map[TopicPartition]kafka.TopicPartition, len(res))
	for _, r := range res {
		if r.Topic != nil {
			byTP[TopicPartition{Topic: *r.Topic, Partition: r.Partition}] = r
		}
	}
	for i, p := range parts {
		offs[i] = -1
		tp := TopicPartition{Topic: *p.Topic, Partition: p.Partition}
		r, ok := byTP[tp]
		switch {
		case err != nil:
			errs[i] = fmt.Errorf("read committed offset: %w", err)
		case !ok:
			errs[i] = fmt.Errorf("read committed offset: %s not in the answer", tp)
		case r.Error != nil:
			errs[i] = fmt.Errorf("read committed offset: %w", r.Error)
		case r.Offset >= 0:
			offs[i] = int64(r.Offset)
		}
		// Otherwise the answer is kafka.OffsetInvalid: the group has no
		// committed offset for the partition.
	}
	return offs, errs
}

// resumeAtLeastOnce decides where a partition starts in at-least-once
// mode: Kafka's committed offset, or what this instance applied before its
// assignment was lost (applied, when lost is set) if that is ahead; every
// record below the higher of the two was applied. When Kafka answered that
// the group has no committed offset (committed -1) and nothing was
// applied, auto.offset.reset picks the log start or, for "latest", its end,
// read from the bounds already looked up: the partition is always assigned
// at an offset, so librdkafka never looks the position up again itself (a
// second lookup that, when it fails, leaves the partition in a state every
// later seek refuses). A position past the log end (high) or below the log
// start (low) starts at the log start.
func resumeAtLeastOnce(committed, applied int64, lost bool, low, high int64, reset string) position {
	p := position{Start: committed}
	switch {
	case lost && applied > committed && applied <= high:
		p.Start, p.Resumed = applied, true
	case committed < 0 && reset == "latest":
		p.Start = high
	case committed < 0:
		p.Start = low
	}
	return p.clamp(low, high)
}

// firstClaim decides where an exactly-once partition starts when the store
// has never seen it (the group moves to ratchet, or from at-least-once to
// exactly-once): where the group's committed offset is, clamped to the log,
// and auto.offset.reset only when Kafka answered that the group has none
// (committed -1; reset "latest": the log end; any other: the log start).
// Start is the fallback of the claim: always an offset.
func firstClaim(committed, low, high int64, reset string) position {
	switch {
	case committed >= 0:
		return position{Start: committed}.clamp(low, high)
	case reset == "latest":
		return position{Start: high}
	}
	return position{Start: low}
}

// resumeClaimed decides where a claimed partition starts in exactly-once
// mode: the stored position (next), or the log start when the position is
// outside the log (past the end: the topic was recreated; below the start:
// retention deleted records before they were applied). The claim is then
// moved there, guarded by its epoch.
func resumeClaimed(next, low, high int64) position {
	return position{Start: next}.clamp(low, high)
}
