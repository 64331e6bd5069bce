package main

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"ratchet/internal/metrics"
)

// TestRecordsTotalReadsTheEnginesCollector: once ratchet_records_total has
// a series, recordsTotal reads the engine's own collector (not a gather of
// the registry), and it counts what the engine adds afterwards.
func TestRecordsTotalReadsTheEnginesCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	e := &runningEngine{reg: reg}
	if got := e.recordsTotal(); got != 0 || e.records != nil {
		t.Fatalf("before any record: %v (collector found: %v), want 0 and none", got, e.records != nil)
	}
	m.Records.WithLabelValues("orders", "0").Add(3)
	m.Records.WithLabelValues("orders", "1").Add(4)
	if got := e.recordsTotal(); got != 7 {
		t.Fatalf("first read %v, want 7", got)
	}
	if e.records == nil {
		t.Fatal("the engine's collector was not found")
	}
	m.Records.WithLabelValues("orders", "2").Add(5)
	if got, want := e.recordsTotal(), e.counter("ratchet_records_total"); got != 12 || want != 12 {
		t.Fatalf("from the collector %v, by gathering %v, want 12", got, want)
	}
	// The probe registered to find the collector is not left behind.
	n := 0
	for _, name := range mustGather(t, reg) {
		if name == "ratchet_records_total" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("ratchet_records_total gathered %d times, want once", n)
	}
}

func mustGather(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	return names
}
