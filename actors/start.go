package actors

// Where a newly assigned partition starts. The I/O (Kafka's committed
// offset, the log's bounds, the claim) happens in startOffsets; the
// decisions are here, pure, so that each case has a row in a table test.

// position is where a partition starts and what that decision found.
type position struct {
	// Start is the first offset to apply; -1 when none is known (Kafka's
	// committed offset is missing: auto.offset.reset applies).
	Start int64
	// PastEnd: the known position was beyond the log end (the topic was
	// deleted and recreated, or truncated); Start is the log start.
	PastEnd bool
	// Resumed: at-least-once, Start is what this instance applied before it
	// lost the partition, ahead of Kafka's committed offset.
	Resumed bool
	// Deleted counts the records between the position and the log start
	// that retention deleted before they were applied.
	Deleted int64
}

// resumeAtLeastOnce decides where a partition starts in at-least-once
// mode: Kafka's committed offset (-1: none), or what this instance applied
// before its assignment was lost (applied, when lost is set) if that is
// ahead; every record below the higher of the two was applied. A position
// past the log end (high) starts at the log start (low).
func resumeAtLeastOnce(committed, applied int64, lost bool, low, high int64) position {
	p := position{Start: committed}
	if lost && applied > committed && applied <= high {
		p.Start, p.Resumed = applied, true
	}
	if p.Start > high {
		p.Start, p.PastEnd = low, true
	}
	return p
}

// claimFallback is the position an exactly-once claim starts a partition
// at when the store has never seen it: Kafka's committed offset when it is
// inside the log, else auto.offset.reset (reset "latest": the log end; any
// other: the log start).
func claimFallback(committed, low, high int64, reset string) int64 {
	if committed >= 0 && committed <= high {
		return committed
	}
	if reset == "latest" {
		return high
	}
	return low
}

// resumeClaimed decides where a claimed partition starts in exactly-once
// mode: the stored position (next), or the log start when the position is
// past the log end (the claim is then moved there, guarded by its epoch).
// A position below the log start is kept (librdkafka resets the fetch);
// what lies between was deleted by retention before it was applied.
func resumeClaimed(next, low, high int64) position {
	switch {
	case next > high:
		return position{Start: low, PastEnd: true}
	case next < low:
		return position{Start: next, Deleted: low - next}
	}
	return position{Start: next}
}
