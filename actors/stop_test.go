package actors

import (
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestStopForgetsEveryPartitionInTheCommitter stops a consumer whose final
// commit fails (the broker refuses it), as a rebuild or the engine's stop
// would: the committer must forget every partition of that consumer. If it
// kept them, its next periodic commit, through the consumer built after a
// rebuild, would carry watermarks of partitions another member owns by
// then.
func TestStopForgetsEveryPartitionInTheCommitter(t *testing.T) {
	sys, committer, fk, m := newTestCommitter(t, time.Hour)
	fk.fail[0] = errors.New("broker away")
	fk.fail[1] = errors.New("broker away")
	s := NewSupervisor(sys, SupervisorConfig{Committer: committer, DrainTimeout: time.Second,
		Metrics: m, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	drained := actor.PropsFromFunc(func(c actor.Context) {
		if _, ok := c.Message().(*Drain); ok {
			c.Respond(&Drained{})
		}
	})
	for p := range int32(2) {
		tp := TopicPartition{Topic: "events", Partition: p}
		progress := newProgress(-1)
		progress.Next.Store(10)
		s.parts[tp] = &assigned{tp: tp, pid: sys.Root.Spawn(drained), progress: progress, gen: 1, held: NewHeld(s.budget)}
		sys.Root.Send(committer, &Register{TP: tp, Gen: 1, Start: 0, Committed: -1, Progress: progress})
		sys.Root.Send(committer, &OffsetApplied{TP: tp, Gen: 1, Next: 10})
	}

	s.stop(time.Now())

	if n := testutil.ToFloat64(m.UncommittedRecords.WithLabelValues("events")); n != 20 {
		t.Errorf("ratchet_uncommitted_records_total = %v, want 20 (the stop gave both partitions up)", n)
	}
	f := flush(t, sys, committer, &Flush{}) // every partition the committer still knows
	if len(f.Pending) != 0 || len(f.Committed) != 0 {
		t.Errorf("after the stop the committer still holds %v (committed %v): a later commit would carry them",
			f.Pending, f.Committed)
	}
	if len(s.parts) != 0 {
		t.Errorf("%d partitions left after the stop", len(s.parts))
	}
}
