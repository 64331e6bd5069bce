package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// OwnedPosition is one ratchet_offsets row as OwnedPositions reads it.
type OwnedPosition struct {
	Topic     string
	Partition int32
	Next      int64
	Epoch     int64
}

// OwnedPositions returns the stored position and epoch of every partition
// of group whose last claim was owner's. A running owner compares them
// with what it believes (actors.ResetWatch) to notice an offsets reset
// while no record arrives.
//
// It is one statement in its own implicit transaction, sent in the pool's
// query mode like every other statement of ratchet: it leaves nothing on
// the session (no LISTEN, no lock, no SET), so a transaction-mode pooler
// may hand each poll to a different server connection.
func OwnedPositions(ctx context.Context, pool *pgxpool.Pool, group, owner string) ([]OwnedPosition, error) {
	rows, err := pool.Query(ctx, `
SELECT topic, partition, next_offset, epoch FROM ratchet_offsets
WHERE consumer_group = $1 AND owner = $2`, group, owner)
	if err != nil {
		return nil, fmt.Errorf("read owned offsets of %s: %w", group, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OwnedPosition, error) {
		var p OwnedPosition
		err := r.Scan(&p.Topic, &p.Partition, &p.Next, &p.Epoch)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("read owned offsets of %s: %w", group, err)
	}
	return out, nil
}
