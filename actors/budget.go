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
// or dropped.
//
// The poll loop takes no record while the budget is full, and ends a round
// of reading when a partition's records in it take that partition over its
// cap, so what is held passes the budget, and what a partition holds its
// cap, by at most one record. One exception: records librdkafka had
// already fetched for a partition when it was paused can still come out of
// Poll, and are handed over (dropping them would skip them); they are
// counted, and bounded by librdkafka's prefetch. How it is shared:
//
//   - No partition holds more than its cap, max(limit / partitions,
//     limit / capShare) bytes and MaxBuffered records: a partition that
//     stops applying (its database rows locked, its dead-letter topic
//     failing) is paused at its cap and holds at most an eighth of the
//     budget once the instance has more than eight partitions; the others
//     go on in the rest.
//   - Under the caps, the budget is first come first served: a busy
//     partition takes what librdkafka fetched for it, and librdkafka
//     fetches from every unpaused partition in turn (at most
//     max.partition.fetch.bytes each per fetch), so a quiet partition's
//     records wait at most until the next batch anywhere is applied.
//   - When the budget stays full for holdFor (nothing applied meanwhile),
//     every partition is paused, so that the poll loop can go on serving
//     the group (rebalances, max.poll.interval.ms) without taking records,
//     and resumed once half of what the partitions paused at their cap
//     leave of the budget is free.
//
// librdkafka's prefetch (queued.max.messages.kbytes, internal/kafkaclient)
// is bounded separately, for the whole consumer, and comes on top.
type Budget struct {
	limit int64
	held  atomic.Int64 // read without the lock by the poll loop
	peak  atomic.Int64
	// mu orders the changes of every account (Held) with the budget's
	// counts: an actor's release and the owner's End never both give back
	// the same bytes.
	mu sync.Mutex
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
	return &Budget{limit: limit}
}

// Limit returns the budget in bytes.
func (b *Budget) Limit() int64 { return b.limit }

// Held returns the bytes held by all partition actors now.
func (b *Budget) Held() int64 { return b.held.Load() }

// Peak returns the most bytes held at once so far.
func (b *Budget) Peak() int64 { return b.peak.Load() }

// full reports whether the poll loop must take no more records, counting
// pending: bytes read in this round and not yet handed over.
func (b *Budget) full(pending int64) bool { return b.held.Load()+pending >= b.limit }

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
	h.records.Add(records)
	h.bytes.Add(bytes)
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
	pressureHold            // over its cap: take no records for a moment
	pressurePause           // over its cap for holdFor: pause it
	pressureResume          // paused at its cap and down to half of it: resume it
)

// partitionPressure decides for one partition holding bytes and records,
// against its caps; overFor is how long it has been over them unpaused.
// Holding off costs nothing but leaves every partition waiting on this
// one; pausing makes librdkafka drop what it prefetched for the partition
// and fetch it again on resume (PITFALLS A8), which cost a third of the
// throughput of a backlog drain when partitions kept reaching the bound.
// So a partition is paused only once it stayed over for holdFor, and
// resumed with hysteresis at half its caps.
func partitionPressure(bytes, records, capBytes, capRecords int64, paused bool, overFor time.Duration) pressure {
	over := bytes > capBytes || records > capRecords
	switch {
	case paused && bytes <= capBytes/2 && records <= capRecords/2:
		return pressureResume
	case paused || !over:
		return pressureNone
	case overFor < holdFor:
		return pressureHold
	}
	return pressurePause
}

// backpressure keeps what partition actors hold within the budget and
// each partition within its cap (see Budget). It returns true when the
// poll loop must take no records now. It looks only at the partitions
// that went over their cap (s.watch) and at the budget's total, so its
// cost does not grow with the partitions assigned.
func (s *Supervisor) backpressure() (hold bool) {
	now := time.Now()
	capBytes := s.budget.partitionCap(len(s.parts))
	capRecords := int64(s.cfg.MaxBuffered)
	if capRecords <= 0 {
		capRecords = 1<<63 - 1
	}
	var pause, resume []kafka.TopicPartition
	var capped int64 // held by partitions paused at their cap
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
		switch partitionPressure(a.held.Bytes(), a.held.Records(), capBytes, capRecords, a.paused, overFor) {
		case pressureNone:
			if !a.paused {
				a.overSince, a.watched = time.Time{}, false
				continue
			}
			capped += a.held.Bytes()
		case pressureHold:
			if a.overSince.IsZero() {
				a.overSince = now
			}
			hold = true
		case pressurePause:
			capped += a.held.Bytes()
			pause = append(pause, ktp(a.tp, kafka.OffsetInvalid))
			a.paused, a.capped, a.overSince = true, true, time.Time{}
			s.cfg.Metrics.Paused.Inc()
		case pressureResume:
			if s.squeezed {
				capped += a.held.Bytes()
				break // resumed with the others once half the budget is free
			}
			resume = append(resume, ktp(a.tp, kafka.OffsetInvalid))
			a.paused, a.capped, a.watched = false, false, false
			s.cfg.Metrics.Paused.Dec()
			continue
		}
		keep = append(keep, a)
	}
	clear(s.watch[len(keep):])
	s.watch = keep

	held := s.budget.Held()
	switch {
	case s.squeezed && s.budget.limit-held >= (s.budget.limit-capped)/2:
		// Half of what the partitions paused at their cap leave is free:
		// partitions that stopped applying do not keep the others paused.
		resume = append(resume, s.unsqueeze(capBytes, capRecords)...)
	case s.squeezed:
	case held >= s.budget.limit:
		if s.fullSince.IsZero() {
			s.fullSince = now
		}
		if now.Sub(s.fullSince) < holdFor {
			hold = true
			break
		}
		pause = append(pause, s.squeeze(capBytes, capRecords)...)
	default:
		s.fullSince = time.Time{}
	}
	s.pauseResume(pause, resume)
	return hold
}

// squeeze pauses every unpaused partition: the budget stayed full for
// holdFor. The poll loop polls on (the group needs it) and takes nothing.
// A partition holding more than half its cap is paused as at its cap
// (watched, resumed at half of it): if it has stopped applying, what it
// holds must not keep the others paused (see backpressure).
func (s *Supervisor) squeeze(capBytes, capRecords int64) []kafka.TopicPartition {
	s.squeezed, s.fullSince = true, time.Time{}
	list := make([]kafka.TopicPartition, 0, len(s.parts))
	for tp, a := range s.parts {
		if a.paused {
			continue
		}
		a.paused, a.overSince = true, time.Time{}
		if a.held.Bytes() > capBytes/2 || a.held.Records() > capRecords/2 {
			a.capped = true
			if !a.watched {
				a.watched = true
				s.watch = append(s.watch, a)
			}
		}
		s.cfg.Metrics.Paused.Inc()
		list = append(list, ktp(tp, kafka.OffsetInvalid))
	}
	s.cfg.Logger.Info("memory budget full and nothing applied meanwhile; pausing every partition until half of it is free",
		"budget_bytes", s.budget.limit, "held_bytes", s.budget.Held(), "partitions", len(list))
	return list
}

// unsqueeze resumes the partitions squeeze paused, except those still over
// their cap, which stay paused until they are down to half of it.
func (s *Supervisor) unsqueeze(capBytes, capRecords int64) []kafka.TopicPartition {
	s.squeezed = false
	list := make([]kafka.TopicPartition, 0, len(s.parts))
	for tp, a := range s.parts {
		if !a.paused {
			continue
		}
		if a.held.Bytes() > capBytes/2 || a.held.Records() > capRecords/2 {
			if !a.watched {
				a.capped, a.watched = true, true
				s.watch = append(s.watch, a)
			}
			continue
		}
		a.paused, a.capped = false, false
		s.cfg.Metrics.Paused.Dec()
		list = append(list, ktp(tp, kafka.OffsetInvalid))
	}
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
// records more of bytes, is over its cap.
func (s *Supervisor) overCap(a *assigned, records int, bytes int64) bool {
	return a.held.Bytes()+bytes > s.budget.partitionCap(len(s.parts)) ||
		(s.cfg.MaxBuffered > 0 && a.held.Records()+int64(records) > int64(s.cfg.MaxBuffered))
}

// watchIfOver puts a partition that has just been handed records on the
// watch list when it went over its cap.
func (s *Supervisor) watchIfOver(a *assigned) {
	if !a.watched && s.overCap(a, 0, 0) {
		a.watched = true
		s.watch = append(s.watch, a)
	}
}
