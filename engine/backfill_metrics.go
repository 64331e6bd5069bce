package engine

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"ratchet/internal/metrics"
	"ratchet/internal/store"
)

// backfillScrapeTimeout bounds the query a scrape of /metrics runs for the
// backfills' progress.
const backfillScrapeTimeout = 2 * time.Second

// backfillCollector exports on the live engine's /metrics the progress of
// the group's pipeline backfills (`ratchet pipelines backfill NAME
// --execute`, a process of its own that may run anywhere), as each
// backfill records it in ratchet_pipeline_backfills in the transactions
// of its batches: read at each scrape, so the figures are the committed
// ones. A failed read is not "no backfill": the scrape reports the error
// (its other series are served) and ratchet_pipeline_backfill_scrape_
// errors_total counts it.
type backfillCollector struct {
	group string
	pool  atomic.Pointer[pgxpool.Pool]

	remaining, applied, updated, running *prometheus.Desc
	errors                               prometheus.Counter
}

func newBackfillCollector(group string) *backfillCollector {
	lp := []string{"pipeline", "topic", "partition"}
	return &backfillCollector{
		group: group,
		remaining: prometheus.NewDesc("ratchet_pipeline_backfill_remaining_offsets",
			"Offsets of a pipeline's backfill range not applied yet, per partition (0: done).", lp, nil),
		applied: prometheus.NewDesc("ratchet_pipeline_backfill_records",
			"Records a pipeline's backfill applied so far, per partition, as committed with them (rate() of it is the backfill's records/s).", lp, nil),
		updated: prometheus.NewDesc("ratchet_pipeline_backfill_updated_timestamp_seconds",
			"When a pipeline's backfill last committed a batch on a partition (Unix time).", lp, nil),
		running: prometheus.NewDesc("ratchet_pipeline_backfill_running",
			"1 while a run of a pipeline's backfill holds its lease, 0 otherwise.", []string{"pipeline"}, nil),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "ratchet_pipeline_backfill_scrape_errors_total",
			Help: "Scrapes that could not read the pipeline backfills' progress from PostgreSQL."}),
	}
}

// set gives the collector the pool to read with (nil: the engine is not
// connected, nothing is exported).
func (c *backfillCollector) set(p *pgxpool.Pool) { c.pool.Store(p) }

// Describe sends the descriptors.
func (c *backfillCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.remaining
	ch <- c.applied
	ch <- c.updated
	ch <- c.running
	c.errors.Describe(ch)
}

// Collect reads the backfills' progress and sends it.
func (c *backfillCollector) Collect(ch chan<- prometheus.Metric) {
	defer c.errors.Collect(ch)
	pool := c.pool.Load()
	if pool == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), backfillScrapeTimeout)
	defer cancel()
	ps, err := store.BackfillsOfGroup(ctx, pool, c.group)
	if err != nil {
		c.errors.Inc()
		ch <- prometheus.NewInvalidMetric(c.remaining, err)
		return
	}
	running := map[string]bool{}
	for _, p := range ps {
		l := []string{p.Pipeline, p.Topic, metrics.Partition(p.Partition)}
		ch <- prometheus.MustNewConstMetric(c.remaining, prometheus.GaugeValue, float64(p.Remaining()), l...)
		ch <- prometheus.MustNewConstMetric(c.applied, prometheus.GaugeValue, float64(p.Records), l...)
		ch <- prometheus.MustNewConstMetric(c.updated, prometheus.GaugeValue, float64(p.UpdatedAt.UnixNano())/1e9, l...)
		running[p.Pipeline] = running[p.Pipeline] || p.Running
	}
	for name, r := range running {
		v := 0.0
		if r {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.running, prometheus.GaugeValue, v, name)
	}
}
