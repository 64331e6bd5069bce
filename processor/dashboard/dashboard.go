// Package dashboard is ratchet's built-in processor "dashboard": it counts
// events per metric and minute of event time (UTC) into dashboard_rollups,
// keeping count, sum, min and max, with one upsert per batch.
//
// Concurrent partitions write the same rows (a metric's minute receives
// events from every partition), so each batch writes its rows in (metric,
// bucket) order: all transactions take the row locks in the same order and
// cannot deadlock each other.
package dashboard

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"ratchet/processor"
)

// Name is the processor's name in configuration, logs and metrics.
const Name = "dashboard"

// upsert adds a batch's rollups to dashboard_rollups. The arrays are sorted
// by (metric, bucket) and unnest keeps their order.
const upsert = `
INSERT INTO dashboard_rollups AS r (metric, bucket, count, sum, min, max)
SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::bigint[], $4::float8[], $5::float8[], $6::float8[])
ON CONFLICT (metric, bucket) DO UPDATE SET
	count = r.count + EXCLUDED.count,
	sum   = r.sum + EXCLUDED.sum,
	min   = LEAST(r.min, EXCLUDED.min),
	max   = GREATEST(r.max, EXCLUDED.max)`

// Processor is the dashboard processor. The zero value is ready to use and
// safe for concurrent use.
type Processor struct{}

// New returns the dashboard processor.
func New() processor.Processor { return Processor{} }

// ReadsEvents returns true: the dashboard aggregates ratchet.v1.Event and
// cannot run on raw values (processor.EventReader).
func (Processor) ReadsEvents() bool { return true }

// Name returns "dashboard".
func (Processor) Name() string { return Name }

// Process aggregates b in memory and upserts the result in one statement.
// An empty batch writes nothing; records without an Event are skipped. A
// record whose event cannot be counted (no metric, no or invalid time, a
// value that is not finite) fails the batch with a processor.Permanent
// error, so the engine isolates it instead of letting it poison a sum.
func (Processor) Process(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
	for _, r := range b.Records {
		if err := check(r); err != nil {
			return processor.Permanent(fmt.Errorf("record %s[%d]@%d: %w", r.Topic, r.Partition, r.Offset, err))
		}
	}
	rollups := Aggregate(b.Records)
	if len(rollups) == 0 {
		return nil
	}
	n := len(rollups)
	metrics, buckets := make([]string, n), make([]time.Time, n)
	counts, sums, mins, maxs := make([]int64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	for i, r := range rollups {
		metrics[i], buckets[i] = r.Metric, r.Bucket
		counts[i], sums[i], mins[i], maxs[i] = r.Count, r.Sum, r.Min, r.Max
	}
	// Every partition updates the current minute's rows: the upsert goes
	// with the COMMIT, so their locks are held for no round trip.
	if err := processor.ExecLast(ctx, tx, upsert, metrics, buckets, counts, sums, mins, maxs); err != nil {
		return fmt.Errorf("upsert %d rollups: %w", n, err)
	}
	return nil
}

// check reports why r's event cannot be aggregated; nil for a record
// without an event, which is skipped.
func check(r processor.Record) error {
	ev := r.Event
	if ev == nil {
		return nil
	}
	switch {
	case ev.GetMetric() == "":
		return fmt.Errorf("event has no metric")
	case ev.GetTime() == nil:
		return fmt.Errorf("event %q has no time", ev.GetMetric())
	case ev.GetTime().CheckValid() != nil:
		return fmt.Errorf("event %q: %w", ev.GetMetric(), ev.GetTime().CheckValid())
	case math.IsNaN(ev.GetValue()) || math.IsInf(ev.GetValue(), 0):
		return fmt.Errorf("event %q has value %v", ev.GetMetric(), ev.GetValue())
	}
	return nil
}
