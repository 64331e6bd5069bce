package actors

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Progress is what one partition assignment reports for observers (the
// page, readiness, lag). The partition actor, its retry child and the
// committer write it with atomics; observers only read.
type Progress struct {
	Next        atomic.Int64 // first offset not applied; -1 unknown
	Committed   atomic.Int64 // last offset Kafka acknowledged; -1 unknown
	Records     atomic.Int64
	Retries     atomic.Int64
	DeadLetters atomic.Int64
	Restarts    atomic.Int64
	Degraded    atomic.Bool // a transient failure is being retried
	// Held: the batch in flight is held by the pipeline guard (guard.go)
	// and runs no transaction; it ends only when the actor stops.
	Held atomic.Bool
}

func newProgress(start int64) *Progress {
	p := &Progress{}
	p.Next.Store(start)
	p.Committed.Store(start)
	return p
}

// PartitionSnapshot is one partition as the status board last saw it.
type PartitionSnapshot struct {
	Topic      string
	Partition  int32
	Epoch      int64
	Next       int64
	Committed  int64
	End        int64 // high watermark; -1 unknown
	Lag        int64
	Records    int64
	Retries    int64
	DeadLetter int64
	Restarts   int64
	RatePerSec float64
	Paused     bool
	Degraded   bool
}

// Phase is the supervisor's lifecycle phase.
type Phase int32

// Phases, in order.
const (
	PhaseStarting Phase = iota
	PhaseRunning
	PhaseDraining
	PhaseStopped
)

// Board is the supervisor's published state, safe for concurrent readers.
// The poll loop refreshes it about once a second.
type Board struct {
	phase atomic.Int32
	mu    sync.Mutex
	parts []PartitionSnapshot
	at    time.Time
	// unclaimed counts assigned partitions held paused because their
	// claim failed; unclaimedWhy names one of them and the error.
	unclaimed    int
	unclaimedWhy string
	// waitSince is when the member was left subscribed without an
	// assignment (unix nanoseconds; 0 while it has one), waitBound the
	// watchdog's bound then (assignwait.go).
	waitSince atomic.Int64
	waitBound atomic.Int64
}

// Unclaimed returns how many assigned partitions wait for their claim to
// succeed, and why one of them does.
func (b *Board) Unclaimed() (int, string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.unclaimed, b.unclaimedWhy
}

func (b *Board) setUnclaimed(n int, why string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.unclaimed, b.unclaimedWhy = n, why
}

// Phase returns the current phase.
func (b *Board) Phase() Phase { return Phase(b.phase.Load()) }

// Partitions returns the last snapshot, sorted by topic and partition.
func (b *Board) Partitions() []PartitionSnapshot {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]PartitionSnapshot(nil), b.parts...)
}

func (b *Board) publish(parts []PartitionSnapshot, at time.Time) {
	sort.Slice(parts, func(i, j int) bool {
		if parts[i].Topic != parts[j].Topic {
			return parts[i].Topic < parts[j].Topic
		}
		return parts[i].Partition < parts[j].Partition
	})
	b.mu.Lock()
	defer b.mu.Unlock()
	b.parts, b.at = parts, at
}
