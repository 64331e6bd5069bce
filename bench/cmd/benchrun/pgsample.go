package main

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// engineApp is the application_name of the in-process engine's
// connections, so that pg_stat_activity tells them from the bench's own.
const engineApp = "ratchet-bench-engine"

// withApp returns the postgres URL u with application_name set to app.
func withApp(u, app string) string {
	p, err := url.Parse(u)
	if err != nil {
		return u
	}
	q := p.Query()
	q.Set("application_name", app)
	p.RawQuery = q.Encode()
	return p.String()
}

// pgStates is what the engine's PostgreSQL connections were doing, on
// average over the samples taken.
type pgStates struct {
	samples int
	avg     map[string]float64 // state → connections in it, on average
}

// stateQuery sorts each of the engine's connections into what it waits for.
const stateQuery = `
SELECT CASE
	WHEN state = 'idle' THEN 'idle between transactions'
	WHEN state LIKE 'idle in transaction%' THEN 'inside a transaction, waiting for the engine'
	WHEN wait_event_type = 'Lock' THEN 'waiting on a lock (' || wait_event || ')'
	WHEN wait_event IN ('WALSync', 'WALWrite', 'WALInsert') THEN 'writing or flushing the WAL'
	WHEN wait_event_type IS NULL THEN 'running a statement'
	ELSE 'other wait (' || wait_event_type || ')' END, count(*)
FROM pg_stat_activity
WHERE datname = current_database() AND application_name = $1
GROUP BY 1`

// samplePG samples the engine's connections every interval until the
// returned stop is called, and returns the averages.
func samplePG(ctx context.Context, pool *pgxpool.Pool, interval time.Duration) (stop func() pgStates) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan pgStates, 1)
	go func() {
		sums := map[string]float64{}
		n := 0
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				st := pgStates{samples: n, avg: map[string]float64{}}
				for k, v := range sums {
					st.avg[k] = v / float64(max(n, 1))
				}
				done <- st
				return
			case <-t.C:
			}
			rows, err := pool.Query(ctx, stateQuery, engineApp)
			if err != nil {
				continue
			}
			var what string
			var count int
			if _, err := pgx.ForEachRow(rows, []any{&what, &count}, func() error {
				sums[what] += float64(count)
				return nil
			}); err == nil {
				n++
			}
		}
	}()
	return func() pgStates {
		cancel()
		return <-done
	}
}

// String lists the states, most connections first.
func (s pgStates) String() string {
	if s.samples == 0 {
		return "no samples"
	}
	keys := make([]string, 0, len(s.avg))
	for k := range s.avg {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		return cmp.Or(cmp.Compare(s.avg[b], s.avg[a]), strings.Compare(a, b))
	})
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.1f", k, s.avg[k]))
	}
	return strings.Join(parts, ", ")
}
