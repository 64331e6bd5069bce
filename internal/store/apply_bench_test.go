package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/types/known/timestamppb"

	"ratchet/internal/store"
	"ratchet/internal/testenv"
	ratchetv1 "ratchet/messages/ratchet/v1"
	"ratchet/processor"
	"ratchet/processor/dashboard"
)

// BenchmarkApplyContended applies dashboard batches of 500 events from 12
// partitions at once, every batch updating the same few rollup rows, as a
// backlog drain does: the transactions queue on those rows' locks, so how
// long each holds them sets the throughput. "pipelined" is store.Apply (the
// dashboard's upsert deferred, sent with the guarded advance and the COMMIT
// in one round trip); "statement-at-a-time" is the same transaction with
// the upsert, the advance and the COMMIT each in its own round trip, the
// baseline. Reported in events/s.
func BenchmarkApplyContended(b *testing.B) {
	const partitions, size = 12, 500
	for _, bc := range []struct {
		name  string
		apply func(ctx context.Context, pool *pgxpool.Pool, s *store.Store, p processor.Processor, b processor.Batch, c *store.Claim) error
	}{
		{"statement-at-a-time", applyStatementAtATime},
		{"pipelined", func(ctx context.Context, _ *pgxpool.Pool, s *store.Store, _ processor.Processor, b processor.Batch, c *store.Claim) error {
			return s.Apply(ctx, b, c)
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			pool := openPool(b, testenv.Postgres(b), partitions+4)
			ctx := testCtx(b)
			if err := store.Migrate(ctx, pool); err != nil {
				b.Fatal(err)
			}
			p := dashboard.New()
			s := store.New(pool, p)
			claims := make([]store.Claim, partitions)
			for i := range claims {
				c, err := store.ClaimPartition(ctx, pool, "g", "events", int32(i), "bench", 0)
				if err != nil {
					b.Fatal(err)
				}
				claims[i] = c
			}
			batches := make(chan int, partitions)
			var wg sync.WaitGroup
			var mu sync.Mutex
			var firstErr error
			b.ResetTimer()
			for i := range partitions {
				wg.Go(func() {
					// The records are built once: the figure is the
					// database's, not the benchmark's allocations.
					bt := eventBatch(int32(i), 0, size)
					for range batches {
						if err := bc.apply(ctx, pool, s, p, bt, &claims[i]); err != nil {
							mu.Lock()
							firstErr = errors.Join(firstErr, err)
							mu.Unlock()
							return
						}
						bt.Start, bt.Next = bt.Next, bt.Next+size
					}
				})
			}
			for n := range b.N {
				batches <- n
			}
			close(batches)
			wg.Wait()
			b.StopTimer()
			if firstErr != nil {
				b.Fatal(firstErr)
			}
			b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// eventBatch is a batch of n events of partition p from offset start, over
// four metrics of one minute.
func eventBatch(p int32, start int64, n int) processor.Batch {
	bt := processor.Batch{Topic: "events", Partition: p, Start: start, Next: start + int64(n)}
	for o := start; o < bt.Next; o++ {
		bt.Records = append(bt.Records, processor.Record{
			Topic: "events", Partition: p, Offset: o,
			Event: &ratchetv1.Event{Id: fmt.Sprint(o), Metric: fmt.Sprintf("m%d", o%4), Value: 1, Time: timestamppb.New(t0)},
		})
	}
	return bt
}

// applyStatementAtATime is the baseline: the transaction of store.Apply with
// every statement, the COMMIT included, in its own round trip.
func applyStatementAtATime(ctx context.Context, pool *pgxpool.Pool, _ *store.Store, p processor.Processor, b processor.Batch, c *store.Claim) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := p.Process(ctx, tx, b); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `
UPDATE ratchet_offsets SET next_offset = $5, updated_at = now()
WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND epoch = $4 AND next_offset = $6`,
			c.Group, c.Topic, c.Partition, c.Epoch, b.Next, b.Start)
		if err == nil && tag.RowsAffected() != 1 {
			err = errors.New("advance refused")
		}
		return err
	})
}
