package actors

import (
	"context"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/internal/store"
)

// watermark is a partition's log start (low) and end (high), or why they
// are unknown.
type watermark struct {
	low, high int64
	err       error
}

// Special timestamps of a ListOffsets request: the end and the start of
// the log.
const (
	offsetsLatest   = -1
	offsetsEarliest = -2
)

// queryWatermarks returns the log start and end of every partition of
// parts in two ListOffsets round trips per partition leader, instead of
// QueryWatermarkOffsets' two per partition: 1024 partitions on one broker
// take two requests, not 2048. OffsetsForTimes with the special timestamps
// -2 (earliest) and -1 (latest) asks exactly what QueryWatermarkOffsets
// asks, with the consumer's isolation level. An error of a whole request
// is the error of every partition; a partition's own error is its alone.
func queryWatermarks(c *kafka.Consumer, parts []kafka.TopicPartition, timeout time.Duration) []watermark {
	out := make([]watermark, len(parts))
	if len(parts) == 0 {
		return out
	}
	ms := int(timeout / time.Millisecond)
	for _, q := range []struct {
		ts  kafka.Offset
		set func(w *watermark, off int64)
	}{
		{offsetsEarliest, func(w *watermark, off int64) { w.low = off }},
		{offsetsLatest, func(w *watermark, off int64) { w.high = off }},
	} {
		list := make([]kafka.TopicPartition, len(parts))
		for i, p := range parts {
			list[i] = kafka.TopicPartition{Topic: p.Topic, Partition: p.Partition, Offset: q.ts}
		}
		res, err := c.OffsetsForTimes(list, ms)
		byTP := make(map[TopicPartition]kafka.TopicPartition, len(res))
		for _, r := range res {
			if r.Topic != nil {
				byTP[TopicPartition{Topic: *r.Topic, Partition: r.Partition}] = r
			}
		}
		for i, p := range parts {
			if out[i].err != nil {
				continue
			}
			if err != nil {
				out[i].err = err
				continue
			}
			r, ok := byTP[TopicPartition{Topic: *p.Topic, Partition: p.Partition}]
			switch {
			case !ok:
				out[i].err = kafka.NewError(kafka.ErrUnknownPartition, "no offset returned", false)
			case r.Error != nil:
				out[i].err = r.Error
			default:
				q.set(&out[i], int64(r.Offset))
			}
		}
	}
	return out
}

// claimed is the outcome of one partition's claim.
type claimed struct {
	claim store.Claim
	err   error
}

// claimAll claims, in exactly-once mode, every partition of parts whose
// committed offset and watermarks are known (errs[i] nil), with one
// ClaimFunc call (one statement for up to 1024 partitions). A partition the
// store has never seen starts at firstClaim. It returns nil in
// at-least-once mode.
func (s *Supervisor) claimAll(ctx context.Context, parts []kafka.TopicPartition, committed []int64, marks []watermark, errs []error) []claimed {
	if s.cfg.Claim == nil {
		return nil
	}
	out := make([]claimed, len(parts))
	reqs := make([]store.ClaimRequest, 0, len(parts))
	at := make([]int, 0, len(parts)) // index in parts of each request
	for i, p := range parts {
		if errs[i] != nil {
			continue
		}
		first := firstClaim(committed[i], marks[i].low, marks[i].high, s.cfg.AutoOffsetReset)
		reqs = append(reqs, store.ClaimRequest{Topic: *p.Topic, Partition: p.Partition, Fallback: first.Start})
		at = append(at, i)
	}
	if len(reqs) == 0 {
		return out
	}
	began := time.Now()
	claims, errs := s.cfg.Claim(ctx, reqs)
	for n, i := range at {
		out[i] = claimed{claim: claims[n], err: errs[n]}
	}
	s.cfg.Logger.Info("partitions claimed", "partitions", len(reqs), "took", time.Since(began).Round(time.Millisecond).String())
	return out
}
