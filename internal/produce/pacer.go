package produce

import (
	"math"
	"time"
)

// unlimitedChunk is how many records Run sends between context checks when
// there is no rate limit.
const unlimitedChunk = 1024

// pacer spreads records evenly over time: record k (counting from 0) is due
// at start + k/rate. Instead of sleeping per record it answers "how many are
// due now", so at high rates records go out in chunks of whatever the timer
// resolution allows. At most burst records may be owed at once: after a
// stall (a full queue, a slow broker) the missed slots are forgotten rather
// than sent in one flood.
type pacer struct {
	rate  float64 // records per second; <= 0 means unlimited
	start time.Time
	burst int64
}

func newPacer(rate float64, start time.Time) *pacer {
	// A tenth of a second's worth, at least one.
	burst := max(int64(rate/10), 1)
	return &pacer{rate: rate, start: start, burst: burst}
}

// due returns how many records may be sent at now, given that sent were
// sent so far. It is 0 when the next record is not due yet.
func (p *pacer) due(now time.Time, sent int64) int64 {
	if p.rate <= 0 {
		return unlimitedChunk
	}
	elapsed := now.Sub(p.start)
	if elapsed < 0 {
		return 0
	}
	// The epsilon keeps a record due exactly at now from being lost to
	// rounding (0.002 s × 500/s is 0.99999…).
	total := int64(math.Floor(elapsed.Seconds()*p.rate+1e-9)) + 1
	n := total - sent
	if n > p.burst {
		// Move the schedule so that exactly burst records are owed now.
		p.start = now.Add(-p.offset(sent + p.burst - 1))
		n = p.burst
	}
	return max(n, 0)
}

// next returns when record number sent (counting from 0) is due.
func (p *pacer) next(sent int64) time.Time {
	if p.rate <= 0 {
		return p.start
	}
	return p.start.Add(p.offset(sent))
}

// offset is the time of record k after start.
func (p *pacer) offset(k int64) time.Duration {
	return time.Duration(math.Ceil(float64(k) / p.rate * float64(time.Second)))
}
