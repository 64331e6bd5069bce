package dashboard

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"ratchet/processor"
)

// Rollup is one row of dashboard_rollups: the events of Metric whose event
// time falls in the minute starting at Bucket (UTC).
type Rollup struct {
	Metric string
	Bucket time.Time
	Count  int64
	Sum    float64
	Min    float64
	Max    float64
}

type key struct {
	metric string
	bucket int64 // Unix seconds of the minute
}

// Aggregate folds records into one Rollup per (metric, minute of event time
// in UTC), sorted by metric then bucket. Records without an Event, and events
// that Process would refuse (no metric, no valid time, a value that is not
// finite), are left out.
func Aggregate(records []processor.Record) []Rollup {
	idx := make(map[key]int)
	var out []Rollup
	for _, r := range records {
		if r.Event == nil || check(r) != nil {
			continue
		}
		ev := r.Event
		bucket := ev.GetTime().AsTime().UTC().Truncate(time.Minute)
		k := key{metric: ev.GetMetric(), bucket: bucket.Unix()}
		v := ev.GetValue()
		i, ok := idx[k]
		if !ok {
			idx[k] = len(out)
			out = append(out, Rollup{Metric: k.metric, Bucket: bucket, Count: 1, Sum: v, Min: v, Max: v})
			continue
		}
		ru := &out[i]
		ru.Count++
		ru.Sum += v
		ru.Min = min(ru.Min, v)
		ru.Max = max(ru.Max, v)
	}
	slices.SortFunc(out, func(a, b Rollup) int {
		return cmp.Or(cmp.Compare(a.Metric, b.Metric), a.Bucket.Compare(b.Bucket))
	})
	return out
}

// Querier is what Read needs; *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy
// it.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Read returns the rollups whose bucket is at or after since, ordered by
// bucket then metric. Buckets are in UTC.
func Read(ctx context.Context, q Querier, since time.Time) ([]Rollup, error) {
	rows, err := q.Query(ctx, `
SELECT metric, bucket, count, sum, min, max FROM dashboard_rollups
WHERE bucket >= $1 ORDER BY bucket, metric`, since)
	if err != nil {
		return nil, fmt.Errorf("read rollups: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Rollup, error) {
		var ru Rollup
		err := r.Scan(&ru.Metric, &ru.Bucket, &ru.Count, &ru.Sum, &ru.Min, &ru.Max)
		ru.Bucket = ru.Bucket.UTC()
		return ru, err
	})
	if err != nil {
		return nil, fmt.Errorf("read rollups: %w", err)
	}
	return out, nil
}
