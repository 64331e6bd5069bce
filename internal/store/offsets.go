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

// ClaimPartition takes ownership of (group, topic, partition) for owner in a
// single statement: it creates the row with next_offset = fallback and epoch
// 1, or raises the existing row's epoch by one and records owner, keeping
// its next_offset. fallback is used only for a new row and must be a real
// offset (>= 0), for instance the Kafka committed offset or the log start.
// Every batch of a previous claim is refused by Apply from then on.
func ClaimPartition(ctx context.Context, pool *pgxpool.Pool, group, topic string, partition int32, owner string, fallback int64) (Claim, error) {
	if fallback < 0 {
		return Claim{}, fmt.Errorf("claim %s[%d]: fallback offset %d is not an offset", topic, partition, fallback)
	}
	c := Claim{Group: group, Topic: topic, Partition: partition, Owner: owner}
	// xmax is 0 only on a row version this statement inserted.
	err := pool.QueryRow(ctx, `
INSERT INTO ratchet_offsets AS o (consumer_group, topic, partition, next_offset, epoch, owner, updated_at)
VALUES ($1, $2, $3, $4, 1, $5, now())
ON CONFLICT (consumer_group, topic, partition) DO UPDATE
SET epoch = o.epoch + 1, owner = EXCLUDED.owner, updated_at = now()
RETURNING o.epoch, o.next_offset, o.xmax = 0`,
		group, topic, partition, fallback, owner).Scan(&c.Epoch, &c.Next, &c.New)
	if err != nil {
		return Claim{}, fmt.Errorf("claim %s[%d] for group %s: %w", topic, partition, group, err)
	}
	return c, nil
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
