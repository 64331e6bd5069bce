package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"ratchet/config"
)

// backfillMetrics are what `pipelines backfill --execute --metrics-addr`
// serves on /metrics while it runs: the run's own figures, updated with
// each batch (the live engine's /metrics shows every backfill's committed
// progress from the database).
type backfillMetrics struct {
	addr      string
	records   *prometheus.CounterVec
	offsets   prometheus.Counter
	remaining prometheus.Gauge
	seen      struct{ applied, dead, skipped, done int64 }
}

// serveBackfillMetrics listens on addr (a port in use is a bad flag:
// exit code 2) and serves the metrics of pipeline's backfill until stop.
func serveBackfillMetrics(addr, pipeline string) (*backfillMetrics, func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, &config.Error{Problems: []config.Problem{{Key: "--metrics-addr", Value: addr, Reason: err.Error()}}}
	}
	reg := prometheus.NewRegistry()
	labels := prometheus.Labels{"pipeline": pipeline}
	m := &backfillMetrics{addr: ln.Addr().String(),
		records: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratchet_backfill_records_total",
			Help: "Records of the backfill's range by result: applied (committed), dead_lettered or passed_over (a replay for another group).", ConstLabels: labels},
			[]string{"result"}),
		offsets: prometheus.NewCounter(prometheus.CounterOpts{Name: "ratchet_backfill_offsets_total",
			Help: "Offsets of the backfill's range passed by committed batches in this run.", ConstLabels: labels}),
		remaining: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ratchet_backfill_remaining_offsets",
			Help: "Offsets of the backfill's range this run has still to pass.", ConstLabels: labels}),
	}
	reg.MustRegister(m.records, m.offsets, m.remaining, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, r := range []string{"applied", "dead_lettered", "passed_over"} {
		m.records.WithLabelValues(r)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { // ends when stop shuts the server down
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Println("backfill metrics:", err)
		}
	}()
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}
	return m, stop, nil
}

// update moves the metrics to r's figures (nothing when not served).
func (m *backfillMetrics) update(r *backfiller) {
	if m == nil {
		return
	}
	m.records.WithLabelValues("applied").Add(float64(r.applied - m.seen.applied))
	m.records.WithLabelValues("dead_lettered").Add(float64(r.dead - m.seen.dead))
	m.records.WithLabelValues("passed_over").Add(float64(r.skipped - m.seen.skipped))
	m.offsets.Add(float64(r.done - m.seen.done))
	m.seen.applied, m.seen.dead, m.seen.skipped, m.seen.done = r.applied, r.dead, r.skipped, r.done
	m.remaining.Set(float64(r.total - r.done))
}
