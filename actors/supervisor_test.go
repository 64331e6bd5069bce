package actors

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"ratchet/internal/metrics"
)

func TestPartitionPressure(t *testing.T) {
	free := limits{capBytes: 1000, capRecords: 100, reserve: 200, halfFree: true}
	full := limits{capBytes: 1000, capRecords: 100, reserve: 200, sharedFull: true}
	squeezed := full
	squeezed.squeezed = true
	cases := []struct {
		name           string
		bytes, records int64
		limits         limits
		paused         bool
		overFor        time.Duration
		want           pressure
	}{
		{"under both caps", 1000, 100, free, false, 0, pressureNone},
		{"just over the bytes", 1001, 1, free, false, 0, pressureHold},
		{"just over the records", 10, 101, free, false, 0, pressureHold},
		{"over, still holding", 5000, 1, free, false, holdFor - time.Millisecond, pressureHold},
		{"over for holdFor", 5000, 1, free, false, holdFor, pressurePause},
		{"paused, above half", 501, 1, free, true, 0, pressureNone},
		{"paused, records above half", 10, 51, free, true, 0, pressureNone},
		{"paused, down to half", 500, 50, free, true, 0, pressureResume},
		{"shared full, within the reserve", 200, 1, full, false, 0, pressureNone},
		{"shared full, above the reserve", 201, 1, full, false, 0, pressureHold},
		{"squeezed, above the reserve", 201, 1, squeezed, false, 0, pressurePause},
		{"squeezed, within the reserve", 200, 1, squeezed, false, 0, pressureNone},
		{"shared full, paused above half the reserve", 101, 1, full, true, 0, pressureNone},
		{"shared full, paused down to half the reserve", 100, 1, full, true, 0, pressureResume},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := partitionPressure(c.bytes, c.records, c.limits, c.paused, c.overFor); got != c.want {
				t.Errorf("partitionPressure = %d, want %d", got, c.want)
			}
		})
	}
}

func TestPartitionCap(t *testing.T) {
	b := NewBudget(64 << 20)
	for _, c := range []struct {
		partitions int
		want       int64
	}{
		{0, 64 << 20}, {1, 64 << 20}, {4, 16 << 20}, {8, 8 << 20}, {12, 8 << 20}, {1024, 8 << 20},
	} {
		if got := b.partitionCap(c.partitions); got != c.want {
			t.Errorf("cap of one of %d partitions = %d, want %d", c.partitions, got, c.want)
		}
	}
}

// TestBackpressureHoldsBeforePausing: a partition just over its cap makes
// the poll loop hold off instead of pausing it (a pause drops librdkafka's
// prefetch); under the cap again, nothing is held. A full budget holds the
// poll loop too. Pausing a partition that stays full is proved end to end
// by TestStuckPartitionDoesNotBlockOthers and test/faults TestPostgresCut15s.
func TestBackpressureHoldsBeforePausing(t *testing.T) {
	tp := TopicPartition{Topic: "events", Partition: 0}
	budget := NewBudget(1 << 20)
	a := &assigned{tp: tp, held: NewHeld(budget)}
	s := &Supervisor{cfg: SupervisorConfig{MaxBuffered: 100}, parts: map[TopicPartition]*assigned{tp: a}, budget: budget}

	a.held.Add(100, 100*recordOverhead)
	s.watchIfOver(a)
	if s.backpressure() || a.watched {
		t.Fatal("held at the cap")
	}
	a.held.Add(1, recordOverhead)
	s.watchIfOver(a)
	if !s.backpressure() {
		t.Fatal("not held above the cap")
	}
	if a.paused || a.overSince.IsZero() {
		t.Fatalf("paused %v, over since %v; want a hold, not a pause", a.paused, a.overSince)
	}
	since := a.overSince
	if time.Since(since) < holdFor/2 { // a second look past holdFor would pause (no consumer here)
		if !s.backpressure() || a.overSince != since {
			t.Fatal("a second look must keep holding from the same moment")
		}
	}
	a.held.Release(61, 61*recordOverhead)
	if s.backpressure() || !a.overSince.IsZero() || a.watched {
		t.Fatalf("still held (over since %v) below the cap", a.overSince)
	}

	// The budget full: held, whatever the partition's cap says.
	a.held.Release(40, 40*recordOverhead)
	a.held.Add(1, 1<<20)
	if !s.backpressure() || s.fullSince.IsZero() {
		t.Fatal("not held with the budget full")
	}
	if !budget.sharedFull(0) || budget.Peak() < 1<<20 {
		t.Fatalf("budget held %d (peak %d), want full", budget.Held(), budget.Peak())
	}
	a.held.Release(1, 1<<20)
	if s.backpressure() || !s.fullSince.IsZero() {
		t.Fatal("held with the budget free")
	}
}

// TestSqueezeLetsStuckPartitionsGo: the shared half of the budget stays
// full with nothing applied, so every partition above its reserve is
// paused. Six partitions that stopped applying hold most of the budget;
// once the others have applied what they held, they are resumed although
// the shared half is still full (of the six's records, which stay paused).
func TestSqueezeLetsStuckPartitionsGo(t *testing.T) {
	const partitions, stuck = 16, 6
	// cap max(1000, 2000) = 2000 bytes a partition, reserve 500, shared 8000
	budget := NewBudget(16000)
	s := &Supervisor{cfg: SupervisorConfig{MaxBuffered: 100000, Metrics: metrics.New(prometheus.NewRegistry()),
		Logger: slog.New(slog.DiscardHandler)}, parts: map[TopicPartition]*assigned{}, budget: budget}
	var all []*assigned
	budget.setPartitions(partitions)
	for p := range int32(partitions) {
		a := &assigned{tp: TopicPartition{Topic: "events", Partition: p}, held: NewHeld(budget)}
		s.parts[a.tp] = a
		all = append(all, a)
		if p < stuck {
			a.held.Add(4, 2000)
		} else {
			a.held.Add(1, 600)
		}
		s.watchIfOver(a)
	}
	if !s.backpressure() {
		t.Fatal("not held with the shared half full")
	}
	s.fullSince = time.Now().Add(-holdFor) // nothing applied for holdFor
	s.backpressure()
	if !s.squeezed {
		t.Fatal("not squeezed after the shared half stayed full for holdFor")
	}
	for _, a := range all {
		if !a.paused || !a.capped {
			t.Fatalf("%s: paused %v capped %v after the squeeze", a.tp, a.paused, a.capped)
		}
	}
	if s.backpressure() {
		t.Fatal("held while squeezed: the partitions within their reserve must go on")
	}
	for _, a := range all {
		if !a.paused {
			t.Fatalf("%s resumed before anything was applied", a.tp)
		}
	}
	for _, a := range all[stuck:] {
		a.held.Release(1, 600) // the healthy partitions apply what they held
	}
	s.backpressure()
	for _, a := range all {
		if a.paused != (a.tp.Partition < stuck) {
			t.Errorf("%s: paused %v, want only the stuck partitions paused", a.tp, a.paused)
		}
	}
	// A healthy partition may hold its reserve again, not more, while the
	// stuck ones keep the shared half full.
	h := all[stuck]
	h.held.Add(1, 500)
	if s.watchIfOver(h); h.watched || s.backpressure() {
		t.Fatal("a partition within its reserve held off")
	}
	h.held.Add(1, 1)
	s.watchIfOver(h)
	if s.backpressure() || !h.paused {
		t.Fatalf("a partition above its reserve while squeezed: paused %v, want paused at once", h.paused)
	}
}
