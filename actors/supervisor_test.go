package actors

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestBackpressureHoldsBeforePausing: a partition just over its bound makes
// the poll loop hold off instead of pausing it (a pause drops librdkafka's
// prefetch); under the bound again, nothing is held. Pausing a partition
// that stays full is proved end to end by test/faults TestPostgresCut15s.
func TestBackpressureHoldsBeforePausing(t *testing.T) {
	var n atomic.Int64
	tp := TopicPartition{Topic: "events", Partition: 0}
	a := &assigned{buffered: &n}
	s := &Supervisor{cfg: SupervisorConfig{MaxBuffered: 100}, parts: map[TopicPartition]*assigned{tp: a}}

	n.Store(100)
	if s.backpressure() {
		t.Fatal("held at the bound")
	}
	n.Store(101)
	if !s.backpressure() {
		t.Fatal("not held above the bound")
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
	n.Store(40)
	if s.backpressure() || !a.overSince.IsZero() {
		t.Fatalf("still held (over since %v) below the bound", a.overSince)
	}
}
