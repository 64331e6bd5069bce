package actors

import (
	"testing"
	"time"
)

// TestCommitterFollowsAMovedOffset: a deliberate move (OffsetMoved) is
// committed even below what Kafka has; after it the usual rule holds again
// (only higher watermarks), and another assignment's move is ignored.
func TestCommitterFollowsAMovedOffset(t *testing.T) {
	sys, pid, fk, _ := newTestCommitter(t, time.Hour)
	tp := TopicPartition{"events", 0}
	sys.Root.Send(pid, &Register{TP: tp, Gen: 1, Start: 10})
	sys.Root.Send(pid, &OffsetApplied{TP: tp, Gen: 1, Next: 50})
	flush(t, sys, pid, &Flush{})
	sys.Root.Send(pid, &OffsetMoved{TP: tp, Gen: 1, Next: 5})
	flush(t, sys, pid, &Flush{})
	sys.Root.Send(pid, &OffsetApplied{TP: tp, Gen: 1, Next: 4})  // lower than the move: ignored
	sys.Root.Send(pid, &OffsetMoved{TP: tp, Gen: 2, Next: 0})    // another assignment's: ignored
	sys.Root.Send(pid, &OffsetApplied{TP: tp, Gen: 1, Next: 20}) // the replay goes on
	flush(t, sys, pid, &Flush{})
	var got []int64
	for _, r := range fk.snapshot() {
		for _, p := range r {
			got = append(got, int64(p.Offset))
		}
	}
	if len(got) != 3 || got[0] != 50 || got[1] != 5 || got[2] != 20 {
		t.Fatalf("commits %v, want 50, 5, 20", got)
	}
}
