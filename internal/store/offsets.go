package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Claim is an instance's ownership of one partition in exactly-once mode, as
// returned by ClaimPartition. Epoch fences every older owner; Next is the
// stored position at claim time, where consumption must start.
type Claim struct {
	Group     string
	Topic     string
	Partition int32
	Epoch     int64
	Owner     string
	Next      int64
	// New reports that the row did not exist and was created with the
	// fallback offset (a first start of this group on this partition).
	New bool
}

// ClaimPartition takes ownership of (group, topic, partition) for owner in
// a single statement: it creates the row with next_offset = fallback and
// epoch 1, or raises the existing row's epoch by one and records owner,
// keeping its next_offset. fallback is used only for a new row and must be
// a real offset (>= 0), for instance the Kafka committed offset or the log
// start. Every batch of a previous claim is refused by Apply from then on.
func ClaimPartition(ctx context.Context, pool *pgxpool.Pool, group, topic string, partition int32, owner string, fallback int64) (Claim, error) {
	claims, errs := ClaimPartitions(ctx, pool, group, owner,
		[]ClaimRequest{{Topic: topic, Partition: partition, Fallback: fallback}})
	return claims[0], errs[0]
}

// ClaimRequest is one partition to claim with ClaimPartitions.
type ClaimRequest struct {
	Topic     string
	Partition int32
	Fallback  int64 // next_offset of a row that does not exist yet; >= 0
}

// claimChunk bounds the rows of one claim statement. Assigning 1024
// partitions takes one round trip.
const claimChunk = 1024

// ClaimPartitions claims every partition of reqs for owner as
// ClaimPartition claims one, in one statement per claimChunk partitions
// rather than one per partition. It returns a claim and an error per
// request, in the order of reqs. A request with a negative fallback, or a
// partition asked twice, gets its own error and is not claimed; a
// statement that fails is the error of every partition in it. Rows are
// locked in (topic, partition) order, so that two instances claiming
// overlapping sets at once cannot deadlock.
func ClaimPartitions(ctx context.Context, pool *pgxpool.Pool, group, owner string, reqs []ClaimRequest) ([]Claim, []error) {
	claims := make([]Claim, len(reqs))
	errs := make([]error, len(reqs))
	type key struct {
		topic     string
		partition int32
	}
	index := make(map[key]int, len(reqs))
	var todo []int
	for i, r := range reqs {
		k := key{r.Topic, r.Partition}
		switch _, dup := index[k]; {
		case r.Fallback < 0:
			errs[i] = fmt.Errorf("claim %s[%d]: fallback offset %d is not an offset", r.Topic, r.Partition, r.Fallback)
		case dup:
			errs[i] = fmt.Errorf("claim %s[%d]: asked twice in one claim", r.Topic, r.Partition)
		default:
			index[k] = i
			todo = append(todo, i)
		}
	}
	for len(todo) > 0 {
		chunk := todo[:min(len(todo), claimChunk)]
		todo = todo[len(chunk):]
		topics := make([]string, len(chunk))
		parts := make([]int32, len(chunk))
		fallbacks := make([]int64, len(chunk))
		for n, i := range chunk {
			topics[n], parts[n], fallbacks[n] = reqs[i].Topic, reqs[i].Partition, reqs[i].Fallback
		}
		// xmax is 0 only on a row version this statement inserted.
		rows, err := pool.Query(ctx, `
INSERT INTO ratchet_offsets AS o (consumer_group, topic, partition, next_offset, epoch, owner, updated_at)
SELECT $1, r.topic, r.partition, r.fallback, 1, $2, now()
FROM unnest($3::text[], $4::int[], $5::bigint[]) AS r(topic, partition, fallback)
ORDER BY r.topic, r.partition
ON CONFLICT (consumer_group, topic, partition) DO UPDATE
SET epoch = o.epoch + 1, owner = EXCLUDED.owner, updated_at = now()
RETURNING o.topic, o.partition, o.epoch, o.next_offset, o.xmax = 0`,
			group, owner, topics, parts, fallbacks)
		seen := 0
		if err == nil {
			var c Claim
			_, err = pgx.ForEachRow(rows, []any{&c.Topic, &c.Partition, &c.Epoch, &c.Next, &c.New}, func() error {
				i, ok := index[key{c.Topic, c.Partition}]
				if !ok {
					return fmt.Errorf("claim returned %s[%d], which was not asked for", c.Topic, c.Partition)
				}
				c.Group, c.Owner = group, owner
				claims[i] = c
				seen++
				return nil
			})
		}
		if err == nil && seen != len(chunk) {
			err = fmt.Errorf("%d rows returned for %d partitions", seen, len(chunk))
		}
		if err != nil {
			// The statement is one transaction: none of its claims holds.
			for _, i := range chunk {
				claims[i] = Claim{}
				errs[i] = fmt.Errorf("claim %s[%d] for group %s: %w", reqs[i].Topic, reqs[i].Partition, group, err)
			}
		}
	}
	return claims, errs
}

// StoredOffset is one row of ratchet_offsets.
type StoredOffset struct {
	Group     string
	Topic     string
	Partition int32
	Next      int64
	Epoch     int64
	Owner     string
	UpdatedAt time.Time
}

// Offsets returns the stored positions of group, ordered by topic and
// partition.
func Offsets(ctx context.Context, pool *pgxpool.Pool, group string) ([]StoredOffset, error) {
	rows, err := pool.Query(ctx, `
SELECT consumer_group, topic, partition, next_offset, epoch, owner, updated_at
FROM ratchet_offsets WHERE consumer_group = $1 ORDER BY topic, partition`, group)
	if err != nil {
		return nil, fmt.Errorf("read offsets of group %s: %w", group, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StoredOffset, error) {
		var o StoredOffset
		err := r.Scan(&o.Group, &o.Topic, &o.Partition, &o.Next, &o.Epoch, &o.Owner, &o.UpdatedAt)
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("read offsets of group %s: %w", group, err)
	}
	return out, nil
}

// MoveOffset sets the stored position of c's partition to next, guarded by
// c's epoch, and returns the claim with the new position. It is for a
// position that no longer exists (the topic was recreated), not for normal
// progress, which only Apply makes.
func MoveOffset(ctx context.Context, pool *pgxpool.Pool, c Claim, next int64) (Claim, error) {
	tag, err := pool.Exec(ctx, `
UPDATE ratchet_offsets SET next_offset = $5, updated_at = now()
WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND epoch = $4`,
		c.Group, c.Topic, c.Partition, c.Epoch, next)
	if err != nil {
		return c, fmt.Errorf("move offset of %s[%d]: %w", c.Topic, c.Partition, err)
	}
	if tag.RowsAffected() != 1 {
		return c, &OffsetConflictError{Kind: Fenced, Group: c.Group, Topic: c.Topic, Partition: c.Partition,
			Epoch: c.Epoch, Start: next, StoredNext: -1}
	}
	c.Next = next
	return c, nil
}
