package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ResetOwner is the owner recorded on a ratchet_offsets row that a reset
// created (a partition no instance had claimed yet). The first claim
// replaces it and keeps the position.
const ResetOwner = "ratchet offsets reset"

// OffsetMove is one partition's move in a reset plan, as planned: the row's
// epoch and position when the plan was made, and the target.
type OffsetMove struct {
	Topic     string
	Partition int32
	// Epoch is the row's epoch at planning time; 0 means there was no row.
	Epoch int64
	// From is the row's position at planning time; -1 means no row.
	From int64
	// To is the new position.
	To int64
	// Target, when set, computes the new position from the position found
	// under the row lock (a relative move such as --shift-by); To is then
	// only what the plan showed.
	Target func(current int64) int64
}

// MoveResult is what ResetOffsets did with one OffsetMove.
type MoveResult struct {
	OffsetMove
	// Moved reports that the row now holds To. Otherwise the row was
	// claimed, created or deleted since the plan and was left as it is.
	Moved bool
	// Epoch and Next of the row as found under the lock (0 and -1: no
	// row). For a moved row, Next is where it was moved from: the owner
	// may have applied batches since the plan.
	FoundEpoch int64
	FoundNext  int64
}

// ResetOffsets applies moves to group's rows of ratchet_offsets in one
// transaction. It locks the rows first (an owner's batch that ends meanwhile
// waits, then finds its advance refused and resumes from the new position),
// and moves a row only when its epoch is still the planned one: a partition
// claimed since the plan belongs to an instance that started from the old
// position, and is reported instead of overwritten. An owner's own progress
// under the planned epoch is not a conflict; the guarded update uses the
// position read under the lock. A move planned for a partition with no row
// creates the row (epoch 1, owner ResetOwner) unless a claim created one
// first.
func ResetOffsets(ctx context.Context, pool *pgxpool.Pool, group string, moves []OffsetMove) ([]MoveResult, error) {
	out := make([]MoveResult, len(moves))
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		topics := make([]string, len(moves))
		parts := make([]int32, len(moves))
		for i, m := range moves {
			topics[i], parts[i] = m.Topic, m.Partition
		}
		type key struct {
			topic string
			part  int32
		}
		type found struct{ epoch, next int64 }
		rows, err := tx.Query(ctx, `
SELECT o.topic, o.partition, o.epoch, o.next_offset FROM ratchet_offsets o
JOIN unnest($2::text[], $3::int[]) AS t(topic, partition) ON o.topic = t.topic AND o.partition = t.partition
WHERE o.consumer_group = $1
ORDER BY o.topic, o.partition
FOR UPDATE OF o`, group, topics, parts)
		if err != nil {
			return fmt.Errorf("lock offsets: %w", err)
		}
		locked := map[key]found{}
		var k key
		var f found
		_, err = pgx.ForEachRow(rows, []any{&k.topic, &k.part, &f.epoch, &f.next}, func() error {
			locked[k] = f
			return nil
		})
		if err != nil {
			return fmt.Errorf("lock offsets: %w", err)
		}
		for i, m := range moves {
			r := MoveResult{OffsetMove: m, FoundNext: -1}
			cur, exists := locked[key{m.Topic, m.Partition}]
			if exists {
				r.FoundEpoch, r.FoundNext = cur.epoch, cur.next
			}
			switch {
			case exists && m.Epoch != 0 && cur.epoch == m.Epoch:
				if m.Target != nil {
					r.To = m.Target(cur.next)
				}
				tag, err := tx.Exec(ctx, `
UPDATE ratchet_offsets SET next_offset = $6, updated_at = now()
WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND epoch = $4 AND next_offset = $5`,
					group, m.Topic, m.Partition, m.Epoch, cur.next, r.To)
				if err != nil {
					return fmt.Errorf("move %s[%d]: %w", m.Topic, m.Partition, err)
				}
				r.Moved = tag.RowsAffected() == 1
			case !exists && m.Epoch == 0:
				if m.Target != nil {
					r.To = m.Target(-1)
				}
				tag, err := tx.Exec(ctx, `
INSERT INTO ratchet_offsets (consumer_group, topic, partition, next_offset, epoch, owner, updated_at)
VALUES ($1, $2, $3, $4, 1, $5, now()) ON CONFLICT DO NOTHING`, group, m.Topic, m.Partition, r.To, ResetOwner)
				if err != nil {
					return fmt.Errorf("move %s[%d]: %w", m.Topic, m.Partition, err)
				}
				r.Moved = tag.RowsAffected() == 1
				if !r.Moved {
					// A claim created the row after the lock was taken.
					err := tx.QueryRow(ctx, `SELECT epoch, next_offset FROM ratchet_offsets
WHERE consumer_group = $1 AND topic = $2 AND partition = $3`, group, m.Topic, m.Partition).Scan(&r.FoundEpoch, &r.FoundNext)
					if err != nil && !errors.Is(err, pgx.ErrNoRows) {
						return fmt.Errorf("read %s[%d]: %w", m.Topic, m.Partition, err)
					}
				} else {
					r.FoundEpoch = 1
				}
			}
			out[i] = r
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reset offsets of group %s: %w", group, err)
	}
	return out, nil
}
