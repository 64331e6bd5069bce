package actors

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// Budget is the instance's memory budget (processing.memory_budget): the
// bytes of records that all partition actors hold together — records
// queued, batches cut ahead and the batch in flight, with the dead letters
// of those batches — whatever the number of partitions. The poll loop adds
// what it hands to a partition actor; the actor releases what it applied
// or dropped (see Held for who gives back what).
//
// How it is shared, so that a partition that applies always has room to
// make progress, however many others are stuck:
//
//   - Half of the budget is reserved: each of n partitions has a reserve
//     of limit / (2n) bytes that no other partition can take. A
//     partition holding less than its reserve is always handed records.
//   - The other half is shared, first come first served: what partitions
//     hold beyond their reserves comes from it. When it is full, a
//     partition above its reserve takes nothing more.
//   - No partition holds more than its cap, max(limit / partitions,
//     limit / capShare) bytes and MaxBuffered records.
//
// A partition that stops applying (its rows locked, its schema registry
// down) is paused at its cap or when the shared half is full; together
// the stuck partitions hold at most their reserves and the shared half,
// never the reserves of the others. A partition that applies gets records
// again as soon as it is down to half its reserve, even while the shared
// half is full of stuck partitions' records: it drains at least
// limit / (4n) bytes a round trip of fetch and transaction. With nothing
// stuck, a few busy partitions share the shared half and their reserves.
//
// The poll loop takes what librdkafka hands it, record by record, for any
// partition, so it ends a round of reading as soon as a partition goes
// over what it may hold, and what is held passes the budget, and what a
// partition holds its cap, by at most one record. Records librdkafka had
// already fetched for a partition when it was paused can still come out of
// Poll, and are handed over (dropping them would skip them); they are
// counted, and bounded by librdkafka's prefetch.
//
// Holding off costs nothing but leaves every partition waiting, and
// pausing makes librdkafka drop what it prefetched for the partition and
// fetch it again on resume (PITFALLS A8). So a partition over its cap is
// first held off for holdFor, then paused; when the shared half is full
// the loop holds off for holdFor, then pauses every partition above its
// reserve (squeezed) and polls on for the others; while squeezed, a
// partition that goes above its reserve is paused at once. A paused
// partition is resumed with hysteresis: down to half its cap, and down to
// half its reserve or with the shared half at most half full.
//
// librdkafka's prefetch (queued.max.messages.kbytes, internal/kafkaclient)
// is bounded separately, for the whole consumer, and comes on top.
type Budget struct {
	limit int64
	held  atomic.Int64 // read without the lock by the poll loop
	peak  atomic.Int64
	// over is what the accounts hold beyond the reserve, summed: the
	// shared part in use. reserve and shared are set by setPartitions.
	over    atomic.Int64
	reserve atomic.Int64
	shared  atomic.Int64
	// mu orders the changes of every account (Held) with the budget's
	// counts: an actor's release and the owner's End never both give back
	// the same bytes. It guards parts and accounts (those holding bytes:
	// a new reserve recounts over from them).
	mu       sync.Mutex
	parts    int
	accounts map[*Held]struct{}
}

// capShare is the smallest part of the budget one partition may take: it
// bounds what a stuck partition holds while letting a busy one use more
// than its even share when the others are idle.
const capShare = 8

// recordOverhead is what a record costs beyond its key, value and headers:
// the kafka.Message the client allocates, the processor.Record and the
// decoded event of a cut batch. An estimate, on the high side for the
// built-in event (measured: about 400 bytes a record of heap beyond the
// value in a backlog drain).
const recordOverhead = 512

// NewBudget returns a budget of limit bytes; limit <= 0 means no limit.
func NewBudget(limit int64) *Budget {
	if limit <= 0 {
		limit = 1<<63 - 1
	}
	b := &Budget{limit: limit, accounts: map[*Held]struct{}{}}
	b.setPartitions(1)
	return b
}

// setPartitions sizes the reserves for n partitions. The poll loop calls
// it before each look at the budget; it recounts only when n changed.
func (b *Budget) setPartitions(n int) {
	n = max(n, 1)
	b.mu.Lock()
	defer b.mu.Unlock()
	if n == b.parts {
		return
	}
	b.parts = n
	r := b.limit / int64(2*n)
	b.reserve.Store(r)
	b.shared.Store(b.limit - r*int64(n))
	var over int64
	for h := range b.accounts {
		over += max(h.bytes.Load()-r, 0)
	}
	b.over.Store(over)
}

// Reserve returns the bytes each partition may hold whatever the others
// hold.
func (b *Budget) Reserve() int64 { return b.reserve.Load() }

// Limit returns the budget in bytes.
func (b *Budget) Limit() int64 { return b.limit }

// Held returns the bytes held by all partition actors now.
func (b *Budget) Held() int64 { return b.held.Load() }

// Peak returns the most bytes held at once so far.
func (b *Budget) Peak() int64 { return b.peak.Load() }

// sharedFull reports whether the shared half is used up, counting pending:
// what this round read beyond the reserves and has not yet handed over.
func (b *Budget) sharedFull(pending int64) bool { return b.over.Load()+pending >= b.shared.Load() }

// sharedHalfFree reports whether at most half of the shared half is used.
func (b *Budget) sharedHalfFree() bool { return b.over.Load() <= b.shared.Load()/2 }

// partitionCap is the most bytes one of n partitions may hold.
func (b *Budget) partitionCap(n int) int64 {
	return max(b.limit/int64(max(n, 1)), b.limit/capShare)
}

// Held is the account of one owner of the budget: one assignment of one
// partition (a partition assigned again gets a new account). It counts the
// records handed to the partition actor and not yet applied or dropped,
// and their bytes (recordBytes). The poll loop takes (Add) when it hands
// records over; the actor gives back (Release) what it applied or dropped,
// and what an incarnation held when it restarts. The poll loop, which
// took the bytes, ends the account (End) when the partition ends, on
// every path (revoked, lost, stopped, rebuilt, over its restart budget):
// records still queued in the actor's mailbox are dropped unseen by a
// Stop (PITFALLS B6), and the budget outlives the consumer, so only the
// owner can give them back. An ended account takes and gives back nothing.
type Held struct {
	records atomic.Int64
	bytes   atomic.Int64
	budget  *Budget // nil: counted for this partition only
	ended   bool    // guarded by budget.mu
}

// NewHeld returns the counter of one partition within budget (nil: none).
func NewHeld(budget *Budget) *Held { return &Held{budget: budget} }

// Records returns the records held.
func (h *Held) Records() int64 { return h.records.Load() }

// Bytes returns the bytes held.
func (h *Held) Bytes() int64 { return h.bytes.Load() }

// Add counts records handed to the partition actor. Only the poll loop
// adds.
func (h *Held) Add(records int, bytes int64) {
	h.move(int64(records), bytes)
}

// Release counts records the partition actor applied or dropped.
func (h *Held) Release(records int, bytes int64) {
	if records == 0 && bytes == 0 {
		return
	}
	h.move(-int64(records), -bytes)
}

// End gives back everything the account still holds and ends it: what
// the actor releases later is not counted again. Called by the poll loop
// once the partition actor has stopped (stopPartitions).
func (h *Held) End() {
	b := h.budget
	if b == nil {
		h.records.Store(0)
		h.bytes.Store(0)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if h.ended {
		return
	}
	h.moveLocked(-h.records.Load(), -h.bytes.Load())
	h.ended = true
}

// move changes the account and the budget's total together.
func (h *Held) move(records, bytes int64) {
	b := h.budget
	if b == nil {
		h.records.Add(records)
		h.bytes.Add(bytes)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if h.ended {
		return // given back by End already
	}
	h.moveLocked(records, bytes)
}

// moveLocked is move with b.mu held.
func (h *Held) moveLocked(records, bytes int64) {
	b := h.budget
	r := b.reserve.Load()
	old := h.bytes.Load()
	now := old + bytes
	h.records.Add(records)
	h.bytes.Store(now)
	switch {
	case now == 0:
		delete(b.accounts, h)
	case old == 0:
		b.accounts[h] = struct{}{}
	}
	b.over.Add(max(now-r, 0) - max(old-r, 0))
	if v := b.held.Add(bytes); v > b.peak.Load() {
		b.peak.Store(v)
	}
}

// recordBytes is what one record counts against the budget.
func recordBytes(m *kafka.Message) int64 {
	n := len(m.Key) + len(m.Value) + recordOverhead
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return int64(n)
}

// messagesBytes is the sum of recordBytes over msgs.
func messagesBytes(msgs []*kafka.Message) int64 {
	var n int64
	for _, m := range msgs {
		n += recordBytes(m)
	}
	return n
}

// pressure is what backpressure does with one partition.
type pressure int

const (
	pressureNone   pressure = iota
	pressureHold            // over what it may hold: take no records for a moment
	pressurePause           // over it for holdFor, or squeezed: pause it
	pressureResume          // paused and down to what it may take again: resume it
)

// limits is what one partition may hold now (see Budget): its caps, its
// reserve, and the state of the shared half.
type limits struct {
	capBytes, capRecords, reserve int64
	sharedFull                    bool // the shared half is used up
	halfFree                      bool // at most half of the shared half is used
	squeezed                      bool // the shared half stayed full for holdFor
}

// over reports whether a partition holding bytes and records holds more
// than it may.
func (l limits) over(bytes, records int64) bool {
	return bytes > l.capBytes || records > l.capRecords || (l.sharedFull && bytes > l.reserve)
}

// partitionPressure decides for one partition holding bytes and records;
// overFor is how long it has been over what it may hold unpaused. A
// partition is paused once it stayed over for holdFor, at once while the
// budget is squeezed, and resumed with hysteresis: down to half its caps,
// and down to half its reserve or with the shared half half free.
func partitionPressure(bytes, records int64, l limits, paused bool, overFor time.Duration) pressure {
	switch {
	case paused && bytes <= l.capBytes/2 && records <= l.capRecords/2 && (bytes <= l.reserve/2 || l.halfFree):
		return pressureResume
	case paused || !l.over(bytes, records):
		return pressureNone
	case !l.squeezed && overFor < holdFor:
		return pressureHold
	}
	return pressurePause
}

// limits returns what partitions may hold now, and sizes the reserves for
// the partitions assigned.
func (s *Supervisor) limits() limits {
	s.budget.setPartitions(len(s.parts))
	capRecords := int64(s.cfg.MaxBuffered)
	if capRecords <= 0 {
		capRecords = 1<<63 - 1
	}
	return limits{capBytes: s.budget.partitionCap(len(s.parts)), capRecords: capRecords, reserve: s.budget.Reserve(),
		sharedFull: s.budget.sharedFull(0), halfFree: s.budget.sharedHalfFree(), squeezed: s.squeezed}
}

// backpressure keeps what partition actors hold within the budget and
// each partition within what it may hold (see Budget). It returns true
// when the poll loop must take no records now. It looks only at the
// partitions that went over (s.watch) and at the budget's counts, so its
// cost does not grow with the partitions assigned (but for the squeeze,
// once per spell of a full shared half).
func (s *Supervisor) backpressure() (hold bool) {
	now := time.Now()
	l := s.limits()
	var pause, resume []kafka.TopicPartition
	keep := s.watch[:0]
	for _, a := range s.watch {
		if s.parts[a.tp] != a || (a.paused && !a.capped) {
			a.watched = false // revoked, or paused for the stop
			continue
		}
		overFor := time.Duration(0)
		if !a.overSince.IsZero() {
			overFor = now.Sub(a.overSince)
		}
		switch partitionPressure(a.held.Bytes(), a.held.Records(), l, a.paused, overFor) {
		case pressureNone:
			if !a.paused {
				a.overSince, a.watched = time.Time{}, false
				continue
			}
		case pressureHold:
			if a.overSince.IsZero() {
				a.overSince = now
			}
			hold = true
		case pressurePause:
			pause = append(pause, ktp(a.tp, kafka.OffsetInvalid))
			a.paused, a.capped, a.overSince = true, true, time.Time{}
			s.cfg.Metrics.Paused.Inc()
		case pressureResume:
			resume = append(resume, ktp(a.tp, kafka.OffsetInvalid))
			a.paused, a.capped, a.watched = false, false, false
			s.cfg.Metrics.Paused.Dec()
			continue
		}
		keep = append(keep, a)
	}
	clear(s.watch[len(keep):])
	s.watch = keep

	switch {
	case s.squeezed && l.halfFree:
		// The partitions it paused are resumed by the rule above, each
		// once it is down to half its cap.
		s.squeezed = false
	case s.squeezed:
	case l.sharedFull:
		if s.fullSince.IsZero() {
			s.fullSince = now
		}
		if now.Sub(s.fullSince) < holdFor {
			hold = true
			break
		}
		pause = append(pause, s.squeeze(l.reserve)...)
	default:
		s.fullSince = time.Time{}
	}
	s.pauseResume(pause, resume)
	return hold
}

// squeeze pauses every unpaused partition above its reserve: the shared
// half stayed full for holdFor. The poll loop polls on (the group needs
// it) for the partitions under their reserve. The paused ones are watched
// and resumed by backpressure once they are down to half their reserve,
// or the shared half is half free: partitions that stopped applying do
// not keep the others paused.
func (s *Supervisor) squeeze(reserve int64) []kafka.TopicPartition {
	s.squeezed, s.fullSince = true, time.Time{}
	var list []kafka.TopicPartition
	for tp, a := range s.parts {
		if a.paused || a.held.Bytes() <= reserve {
			continue
		}
		a.paused, a.capped, a.overSince = true, true, time.Time{}
		if !a.watched {
			a.watched = true
			s.watch = append(s.watch, a)
		}
		s.cfg.Metrics.Paused.Inc()
		list = append(list, ktp(tp, kafka.OffsetInvalid))
	}
	s.cfg.Logger.Info("memory budget full and nothing applied meanwhile; pausing the partitions above their reserve",
		"budget_bytes", s.budget.limit, "held_bytes", s.budget.Held(), "reserve_bytes", reserve, "partitions", len(list))
	return list
}

// pauseResume makes one Pause and one Resume call for the lists.
func (s *Supervisor) pauseResume(pause, resume []kafka.TopicPartition) {
	if s.consumer == nil {
		return // being rebuilt; the partitions are stopped with it
	}
	if len(pause) > 0 {
		if err := s.consumer.Pause(pause); err != nil {
			s.cfg.Logger.Warn("pause partitions", "partitions", len(pause), "err", err)
		}
	}
	if len(resume) > 0 {
		if err := s.consumer.Resume(resume); err != nil {
			s.cfg.Logger.Warn("resume partitions", "partitions", len(resume), "err", err)
		}
	}
}

// overCap reports whether a partition, holding what it holds and handed
// records more of bytes, would hold more than it may; shared is what this
// round's records take of the shared half so far.
func (s *Supervisor) overCap(a *assigned, records int, bytes, shared int64) bool {
	held := a.held.Bytes() + bytes
	return held > s.budget.partitionCap(len(s.parts)) ||
		(s.cfg.MaxBuffered > 0 && a.held.Records()+int64(records) > int64(s.cfg.MaxBuffered)) ||
		(held > s.budget.Reserve() && s.budget.sharedFull(shared))
}

// overShared is what handing a partition records more of bytes, beyond
// pending already read for it, takes of the shared half.
func (s *Supervisor) overShared(a *assigned, pending, bytes int64) int64 {
	r, held := s.budget.Reserve(), a.held.Bytes()+pending
	return max(held+bytes-r, 0) - max(held-r, 0)
}

// watchIfOver puts a partition that has just been handed records on the
// watch list when it holds more than it may.
func (s *Supervisor) watchIfOver(a *assigned) {
	if !a.watched && s.overCap(a, 0, 0, 0) {
		a.watched = true
		s.watch = append(s.watch, a)
	}
}
