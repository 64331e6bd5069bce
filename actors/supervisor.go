package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"

	"ratchet/internal/metrics"
	"ratchet/internal/store"
	"ratchet/internal/tracing"
)

// ClaimFunc claims partitions for this instance in the offset store
// (exactly-once), in as few round trips as it can: each claim raises the
// partition's epoch by one and returns its stored position; Fallback is
// the position of a partition the store has never seen. It returns a claim
// and an error per request, in order (store.ClaimPartitions).
type ClaimFunc func(ctx context.Context, reqs []store.ClaimRequest) ([]store.Claim, []error)

// SupervisorConfig configures the supervisor and its poll loop.
type SupervisorConfig struct {
	// NewConsumer builds a consumer (not yet subscribed).
	NewConsumer func() (*kafka.Consumer, error)
	// Commits is the committer's way to the consumer: the supervisor
	// opens it on every consumer it builds and keeps commits away from
	// the consumer's Close (commitgate.go). nil: the committer commits
	// through nothing.
	Commits *CommitGate
	Topics  []string
	// Claim is set in exactly-once mode, nil in at-least-once mode.
	Claim ClaimFunc
	// Reposition moves a claimed partition's stored position (guarded by
	// the claim's epoch); used when the stored position is past the end of
	// a recreated topic.
	Reposition func(ctx context.Context, c store.Claim, next int64) (store.Claim, error)
	// Format returns the value format of a topic (protobuf, json or raw).
	Format func(topic string) string
	// NewDecoder, when set, returns the value decoder of a newly assigned
	// partition of topic (PartitionConfig.NewDecoder).
	NewDecoder func(topic string) ValueDecoder
	// AutoOffsetReset (earliest or latest) places a partition that has
	// neither a stored nor a committed offset.
	AutoOffsetReset string
	BatchSize       int
	// MaxBatch is the most records a batch takes when its partition is
	// behind (processing.max_batch_size); 0: BatchSize.
	MaxBatch int
	Linger   time.Duration
	// MaxBuffered is the most records one partition holds
	// (processing.max_buffered_per_partition); 0: no bound but the budget.
	MaxBuffered int
	// MemoryBudget is the bytes all partitions hold together
	// (processing.memory_budget, see Budget); 0: no budget.
	MemoryBudget int64
	Retry        RetryPolicy
	Applier      Applier
	DLQ          DeadLetterer
	// DLQTopic returns the dead-letter topic of an input topic.
	DLQTopic  func(topic string) string
	Committer *actor.PID
	// GroupID is kafka.group_id, named in the idle-member warning.
	GroupID string
	// InstanceID is kafka.instance_id (static membership), for messages.
	InstanceID string
	// RecycleInterval rebuilds the consumer this often (drain and flush
	// first); 0 never.
	RecycleInterval time.Duration
	// BrokersDownAfter rebuilds the consumer when every broker has been
	// down this long; 0 never (librdkafka reconnects by itself).
	BrokersDownAfter time.Duration
	// DrainTimeout bounds the drain and flush of a revoke and of a stop.
	DrainTimeout time.Duration
	// SessionTimeout is the group's session timeout (session.timeout.ms),
	// named in the lines that say what a long join waits for; 0: unknown.
	SessionTimeout time.Duration
	// AssignmentTimeout rebuilds the consumer when the member has been
	// subscribed without an assignment this long (assignwait.go,
	// AssignmentTimeout); 0 never.
	AssignmentTimeout time.Duration
	// MaxRestarts within RestartWindow is a partition actor's restart
	// budget; past it the partition actor is stopped.
	MaxRestarts   int
	RestartWindow time.Duration
	Metrics       *metrics.Metrics
	Logger        *slog.Logger
	// ResetWatch, in exactly-once mode, brings an offsets reset to an idle
	// partition (resetwatch.go); nil: off.
	ResetWatch *ResetWatch
	// DeadLetterLog writes the log lines about dead letters for every
	// partition; nil: a line each.
	DeadLetterLog *DeadLetterLog
	// Tracer makes the spans of batches, stops, revokes and claims; nil:
	// off.
	Tracer *tracing.Tracer
	// Guard holds partitions for faults no record is to blame for
	// (guard.go); nil: none.
	Guard *Guard
	// RejectWait is PartitionConfig.RejectWait of every partition.
	RejectWait time.Duration
}

// Supervisor owns the Kafka consumer and its poll loop, and is the parent of
// the partition actors. Run blocks: the calling goroutine becomes the poll
// loop, the only goroutine that ever calls Poll (and so the one that runs the
// rebalance callback).
type Supervisor struct {
	cfg    SupervisorConfig
	system *actor.ActorSystem
	pid    *actor.PID

	// Fields below are touched only by the poll loop goroutine.
	consumer *kafka.Consumer
	parts    map[TopicPartition]*assigned
	gen      uint64
	seeks    chan seekRequest
	// overBudget carries partitions whose actor exceeded its restart
	// budget; the poll loop then stops the engine with an error.
	overBudget chan TopicPartition
	board      *Board
	current    atomic.Pointer[kafka.Consumer] // the consumer whose callbacks count
	// callbacks is held by every rebalance callback, and by closeConsumer
	// while it retires the consumer: an abandoned Close may still be
	// running a callback on its own goroutine. A callback lets it go
	// around the librdkafka calls that may block for good (unlocked).
	callbacks sync.Mutex
	// incrementalAssign and incrementalUnassign are the consumer's; a test
	// holds one, as librdkafka can inside Close.
	incrementalAssign, incrementalUnassign func(*kafka.Consumer, []kafka.TopicPartition) error
	// groupCheck runs the idle check's metadata request; groupCheckBusy
	// keeps it to one. idleSince is when this instance was last left with
	// no partition (zero while it has some); idleWarned: warned since.
	groupCheck     sync.WaitGroup
	groupCheckBusy atomic.Bool
	idleSince      time.Time
	idleWarned     bool
	downSince      time.Time // first all-brokers-down since the last record
	// The assignment wait (assignwait.go): waitSince is when the member
	// was last left subscribed without an assignment (zero while it has
	// one), waitFrom what left it so, waitLogged how much of the wait was
	// logged (1 INFO, 2 WARN). consumerRestarts are the watchdog's
	// rebuilds within the restart window.
	waitSince        time.Time
	waitFrom         string
	waitLogged       int
	consumerRestarts []time.Time
	// trace is the lifecycle span under way (a stop, a revoke), the
	// parent of the spans it leads to; the zero Span when none.
	trace    tracing.Span
	lastSnap time.Time
	lastRecs map[TopicPartition]int64

	// Backpressure (budget.go). budget counts what partition actors hold;
	// roundShared is what this round of the poll loop read beyond the
	// partitions' reserves and has not yet handed over; roundOver is set
	// when a partition's share of the round took it over what it may
	// hold, which ends the round; touched lists the partitions with
	// records pending; watch the partitions over what they may hold.
	// fullSince is when the shared half of the budget became full;
	// squeezed is set while it stays full and the partitions above their
	// reserve are paused.
	budget      *Budget
	roundShared int64
	roundOver   bool
	touched     []*assigned
	watch       []*assigned
	fullSince   time.Time
	squeezed    bool

	// The stop (see group.go). stopping is set while the consumer is being
	// stopped: records are dropped, and partitions assigned meanwhile are
	// parked (assigned and paused, never consumed). deadline bounds the
	// stop's drain and commits. leftCommitted is set once every partition
	// still held has committed what it applied.
	stopping      bool
	deadline      time.Time
	parked        map[TopicPartition]bool
	returned      map[TopicPartition]bool // parked partitions with something to commit (see park)
	leftCommitted bool
	fatal         bool // the consumer reported a fatal error: it commits nothing more
	// rebalances counts the assign callbacks served: each one is a
	// completed rebalance.
	rebalances uint64
	revoked    bool // a revoke callback ran since the last assign callback
	// lostApplied remembers, in at-least-once mode, what this instance
	// applied of partitions whose assignment was lost, so that a partition
	// that comes back resumes from there instead of from an older commit.
	lostApplied map[TopicPartition]int64
	// unclaimed holds the assigned partitions whose claim failed; they are
	// paused and retried (claims.go).
	unclaimed map[TopicPartition]*unclaimed
	clock     stopClock // when the engine's stop was requested (stop.go)
	// abandoned is the watermark each partition was last given up at
	// (abandon): a stop that abandons, and the revoke inside its Close
	// that finds the same commit impossible, report it once.
	abandoned map[TopicPartition]int64
}

// assigned is the poll loop's record of one assigned partition.
type assigned struct {
	tp       TopicPartition
	pid      *actor.PID
	progress *Progress
	epoch    int64
	gen      uint64
	seek     uint64
	held     *Held
	paused   bool
	// capped is set while the partition is paused for being over its cap
	// (budget.go); watched while it is on the watch list. overSince is
	// when it went over its cap without being paused yet (zero when it
	// is not over).
	capped    bool
	watched   bool
	overSince time.Time
	lag       prometheus.Gauge // its lag gauge, looked up once
	// pending holds the records read in this round of the poll loop, not
	// yet handed to the actor, and pendingBytes their recordBytes.
	pending      []*kafka.Message
	pendingBytes int64
}

// holdFor is how long the poll loop stops taking records while a partition
// is over its cap, or the whole budget is full, before it pauses instead
// (see partitionPressure). Rebalance callbacks run inside Poll and wait at
// most this long.
const holdFor = 500 * time.Millisecond

type seekRequest struct {
	pid  *actor.PID
	tp   TopicPartition
	next int64
}

// NewSupervisor returns a supervisor for cfg in system.
func NewSupervisor(system *actor.ActorSystem, cfg SupervisorConfig) *Supervisor {
	return &Supervisor{
		cfg:         cfg,
		system:      system,
		parts:       make(map[TopicPartition]*assigned),
		seeks:       make(chan seekRequest, 1024),
		overBudget:  make(chan TopicPartition, 1),
		board:       &Board{},
		lastRecs:    make(map[TopicPartition]int64),
		parked:      make(map[TopicPartition]bool),
		returned:    make(map[TopicPartition]bool),
		lostApplied: make(map[TopicPartition]int64),
		budget:      NewBudget(cfg.MemoryBudget),
		unclaimed:   make(map[TopicPartition]*unclaimed),

		incrementalAssign:   (*kafka.Consumer).IncrementalAssign,
		incrementalUnassign: (*kafka.Consumer).IncrementalUnassign,
	}
}

// Budget returns the memory budget the partition actors share.
func (s *Supervisor) Budget() *Budget { return s.budget }

// Board returns the supervisor's status board.
func (s *Supervisor) Board() *Board { return s.board }

// Run spawns the supervisor actor, builds the consumer, subscribes and polls
// until ctx is done, then stops: stop polling, drain every partition (finish
// its batch in flight), flush the committer, close the consumer (bounded:
// Close can hang after a fatal error), stop the actors. It returns nil on a
// clean stop.
func (s *Supervisor) Run(ctx context.Context) error {
	props := actor.PropsFromProducer(func() actor.Actor {
		return &supervisorActor{cfg: &s.cfg, children: map[string]child{}, overBudget: s.overBudget}
	},
		actor.WithGuardian(actor.NewOneForOneStrategy(0, time.Second, actor.DefaultDecider)))
	pid, err := s.system.Root.SpawnNamed(props, "supervisor")
	if err != nil {
		return fmt.Errorf("spawn supervisor: %w", err)
	}
	s.pid = pid
	defer s.stopActor(pid)
	defer context.AfterFunc(ctx, func() { s.clock.mark() })()
	s.cfg.Metrics.BudgetBytes.Set(float64(s.budget.Limit()))

	for {
		c, err := s.cfg.NewConsumer()
		if err != nil {
			return err
		}
		s.consumer = c
		s.current.Store(c)
		s.cfg.Commits.open(c)
		if err := c.SubscribeTopics(s.cfg.Topics, s.rebalance); err != nil {
			s.closeConsumer(time.Now().Add(s.cfg.DrainTimeout))
			return fmt.Errorf("subscribe %v: %w", s.cfg.Topics, err)
		}
		s.waitSince = time.Time{} // a new member: its wait starts now
		s.waitForAssignment(time.Now(), "subscribe")
		// The phase moves to running at the first rebalance callback: until
		// then the instance has not joined the group.
		rebuild, runErr := s.poll(ctx)
		began := time.Now()
		if ctx.Err() != nil {
			began = s.clock.mark() // the signal, not the moment the loop noticed
		}
		if rebuild == "" {
			s.board.phase.Store(int32(PhaseDraining))
		} else {
			s.board.phase.Store(int32(PhaseStarting))
			s.cfg.Logger.Info("rebuilding the consumer: draining and flushing first", "reason", rebuild)
		}
		s.stop(began)
		if rebuild == "" || ctx.Err() != nil {
			s.board.phase.Store(int32(PhaseStopped))
			s.board.publish(nil, time.Now())
			return runErr
		}
		s.cfg.Metrics.Reconnects.WithLabelValues(rebuild).Inc()
		s.cfg.Logger.Info("consumer closed; building a new one", "reason", rebuild)
	}
}

// Reasons to rebuild the consumer, as poll returns them.
const (
	rebuildRecycle     = "recycle"
	rebuildFatal       = "fatal"
	rebuildBrokersDown = "brokers_down"
	// rebuildAssignmentWait (assignwait.go): no assignment within
	// AssignmentTimeout.
)

// poll is the loop. It returns when ctx is done (nil, nil), when the
// consumer must be rebuilt (the reason), or with an error that ends the
// engine: a fenced static member (another instance has this
// kafka.instance_id: rebuilding would fence it in turn) or a partition
// over its restart budget.
func (s *Supervisor) poll(ctx context.Context) (string, error) {
	var recycleAt time.Time
	if s.cfg.RecycleInterval > 0 {
		recycleAt = time.Now().Add(s.cfg.RecycleInterval)
	}
	s.downSince = time.Time{}
	s.idleSince, s.idleWarned = time.Time{}, false
	s.watch, s.touched, s.roundShared, s.roundOver, s.fullSince, s.squeezed = nil, nil, 0, false, time.Time{}, false
	for ctx.Err() == nil {
		select {
		case tp := <-s.overBudget:
			return "", fmt.Errorf("partition actor %s over its restart budget", tp)
		default:
		}
		if !recycleAt.IsZero() && time.Now().After(recycleAt) {
			return rebuildRecycle, nil
		}
		if !s.downSince.IsZero() && s.cfg.BrokersDownAfter > 0 && time.Since(s.downSince) > s.cfg.BrokersDownAfter {
			s.cfg.Logger.Warn("all brokers down too long", "for", time.Since(s.downSince).Round(time.Second).String())
			return rebuildBrokersDown, nil
		}
		if r, err := s.checkAssignmentWait(time.Now()); r != "" || err != nil {
			return r, err
		}
		s.serveSeeks()
		s.retryClaims()
		if s.backpressure() {
			// A partition is over its cap and not yet paused, or the
			// budget is full: take no records for a moment (librdkafka
			// keeps what it prefetched; its own bound stops the
			// fetching), then look again.
			if err := sleep(ctx, 2*time.Millisecond); err != nil {
				return "", nil
			}
			continue
		}
		// With partitions paused for the budget, look again soon: one that
		// applied what it held is resumed at the next look, not when the
		// others happen to bring records.
		wait := 100
		if len(s.watch) > 0 {
			wait = 10
		}
		if r, err := s.handle(s.consumer.Poll(wait)); r != "" || err != nil {
			return r, err
		}
		// Take what is already fetched without waiting, so records reach
		// their partitions in runs rather than one message at a time,
		// while the budget has room.
		for range 1000 {
			if s.roundOver {
				break
			}
			ev := s.consumer.Poll(0)
			if ev == nil {
				break
			}
			if r, err := s.handle(ev); r != "" || err != nil {
				return r, err
			}
		}
		s.flushPending()
		if time.Since(s.lastSnap) >= time.Second {
			s.snapshot()
			s.checkIdle(s.consumer)
		}
	}
	return "", nil
}

// snapshot publishes the assigned partitions to the board and the lag
// gauges. The high watermarks come from the consumer's cache (no request).
func (s *Supervisor) snapshot() {
	now := time.Now()
	elapsed := now.Sub(s.lastSnap).Seconds()
	s.lastSnap = now
	out := make([]PartitionSnapshot, 0, len(s.parts))
	for tp, a := range s.parts {
		p := a.progress
		snap := PartitionSnapshot{Topic: tp.Topic, Partition: tp.Partition, Epoch: a.epoch,
			Next: p.Next.Load(), Committed: p.Committed.Load(), End: -1, Records: p.Records.Load(),
			Retries: p.Retries.Load(), DeadLetter: p.DeadLetters.Load(), Restarts: p.Restarts.Load(),
			Paused: a.paused, Degraded: p.Degraded.Load()}
		if _, high, err := s.consumer.GetWatermarkOffsets(tp.Topic, tp.Partition); err == nil && high >= 0 {
			snap.End = high
			pos := max(snap.Next, 0)
			snap.Lag = max(high-pos, 0)
			if a.lag == nil {
				a.lag = s.cfg.Metrics.Lag.WithLabelValues(tp.Topic, metrics.Partition(tp.Partition))
			}
			a.lag.Set(float64(snap.Lag))
		}
		if prev, ok := s.lastRecs[tp]; ok && elapsed > 0 {
			snap.RatePerSec = float64(snap.Records-prev) / elapsed
		}
		s.lastRecs[tp] = snap.Records
		out = append(out, snap)
	}
	for tp := range s.lastRecs {
		if _, ok := s.parts[tp]; !ok {
			delete(s.lastRecs, tp)
		}
	}
	s.cfg.Metrics.HeldBytes.Set(float64(s.budget.Held()))
	s.cfg.Metrics.HeldBytesPeak.Set(float64(s.budget.Peak()))
	s.board.publish(out, now)
}

func (s *Supervisor) handle(ev kafka.Event) (string, error) {
	switch e := ev.(type) {
	case nil:
	case *kafka.Message:
		s.downSince = time.Time{}
		if e.TopicPartition.Error != nil {
			s.cfg.Logger.Warn("consumer message error", "topic", *e.TopicPartition.Topic,
				"partition", e.TopicPartition.Partition, "err", e.TopicPartition.Error)
			return "", nil
		}
		if s.stopping {
			return "", nil // fetched before the pause took effect: never applied
		}
		tp := TopicPartition{Topic: *e.TopicPartition.Topic, Partition: e.TopicPartition.Partition}
		if a, ok := s.parts[tp]; ok {
			if len(a.pending) == 0 {
				s.touched = append(s.touched, a)
				a.pendingBytes = 0 // emptied by a seek or a stop meanwhile
			}
			a.pending = append(a.pending, e)
			n := recordBytes(e)
			s.roundShared += s.overShared(a, a.pendingBytes, n)
			a.pendingBytes += n
			s.roundOver = s.roundOver || s.overCap(a, len(a.pending), a.pendingBytes, s.roundShared)
		}
	case kafka.Error:
		if e.IsFatal() {
			s.fatal = true
			s.cfg.Logger.Error("fatal consumer error", "code", e.Code().String(), "err", e)
			if e.Code() == kafka.ErrFencedInstanceID {
				// Policy: two instances share kafka.instance_id. That is a
				// deployment error; rebuilding would fence the other one
				// and loop. Flush what we can and stop non-zero.
				return "", fmt.Errorf("fenced static member (kafka.instance_id %q is used by another instance): %w",
					s.cfg.InstanceID, e)
			}
			return rebuildFatal, nil
		}
		if e.Code() == kafka.ErrAllBrokersDown {
			if s.downSince.IsZero() {
				s.downSince = time.Now()
			}
		}
		s.cfg.Logger.Warn("consumer error", "code", e.Code().String(), "err", e)
	}
	return "", nil
}

// flushPending hands the records read in this round to their partitions
// and counts them against the budget.
func (s *Supervisor) flushPending() {
	for _, a := range s.touched {
		// A partition revoked in this round (inside Poll) is no longer
		// in parts; one seeked has nothing pending any more.
		if len(a.pending) == 0 || s.parts[a.tp] != a {
			a.pending, a.pendingBytes = nil, 0
			continue
		}
		// Taken here, given back by the actor as it applies or drops
		// them, and by stopPartitions (Held.End) for what it never saw.
		a.held.Add(len(a.pending), a.pendingBytes)
		s.system.Root.Send(a.pid, &Records{Seek: a.seek, Msgs: a.pending})
		a.pending, a.pendingBytes = nil, 0
		s.watchIfOver(a)
	}
	clear(s.touched)
	s.touched = s.touched[:0]
	s.roundShared, s.roundOver = 0, false
}

// serveSeeks moves partitions of restarted actors back to their watermark.
func (s *Supervisor) serveSeeks() {
	for {
		select {
		case r := <-s.seeks:
			s.seek(r)
		default:
			return
		}
	}
}

func (s *Supervisor) seek(r seekRequest) {
	a, ok := s.parts[r.tp]
	if !ok || !a.pid.Equal(r.pid) {
		s.system.Root.Send(r.pid, &Seeked{Next: r.next, Err: errors.New("partition no longer assigned")})
		return
	}
	if r.next < 0 {
		// Nothing was ever read: the mailbox holds the partition from its
		// start, keep it.
		s.system.Root.Send(r.pid, &Seeked{Seek: a.seek, Next: r.next})
		return
	}
	{
		res, err := s.consumer.SeekPartitions([]kafka.TopicPartition{ktp(r.tp, kafka.Offset(r.next))})
		if err == nil && len(res) == 1 && res[0].Error != nil {
			err = res[0].Error
		}
		if err != nil {
			s.system.Root.Send(r.pid, &Seeked{Next: r.next, Err: fmt.Errorf("seek %s to %d: %w", r.tp, r.next, err)})
			return
		}
	}
	// Records read before the seek are still in flight or pending: the new
	// generation tells the actor to drop them.
	a.seek++
	a.pending = nil
	s.system.Root.Send(r.pid, &Seeked{Seek: a.seek, Next: r.next})
	s.cfg.Logger.Info("partition rewound to its watermark after restart", "topic", r.tp.Topic,
		"partition", r.tp.Partition, "offset", r.next)
}

// requestSeek is handed to partition actors; it runs on their goroutine.
func (s *Supervisor) requestSeek(pid *actor.PID, tp TopicPartition, next int64) {
	s.seeks <- seekRequest{pid: pid, tp: tp, next: next}
}

// idleWarnAfter is how long an instance stays without partitions before it
// warns that the group has more members than the input topics have
// partitions. A member that joins a cooperative group is first given
// nothing and gets its share one rebalance later, so an empty assignment
// alone is no evidence; one that lasts this long is.
const idleWarnAfter = 10 * time.Second

// checkIdle warns, once per idle spell, when this instance has held no
// partition for idleWarnAfter. Under cooperative-sticky, which spreads every
// partition across the group, a member stays idle only when the group has
// more members than the input topics have partitions.
//
// The group's size is not asked of the coordinator: librdkafka's
// DescribeConsumerGroups can abort the process when the coordinator
// connection drops while it is in flight (rd_kafka_enq_once_del_source_return
// assertion, librdkafka issue 4605), which is the very fault ratchet must
// ride out. The partition count comes from a metadata request, off the poll
// loop; closeConsumer waits for it.
func (s *Supervisor) checkIdle(c *kafka.Consumer) {
	if s.idleSince.IsZero() || s.idleWarned || time.Since(s.idleSince) < idleWarnAfter {
		return
	}
	if !s.groupCheckBusy.CompareAndSwap(false, true) {
		return
	}
	s.idleWarned = true
	topics := append([]string(nil), s.cfg.Topics...)
	idleFor := time.Since(s.idleSince).Round(time.Second).String()
	s.groupCheck.Go(func() { // ends within the 10 s deadline of its requests
		defer s.groupCheckBusy.Store(false)
		partitions := 0
		for _, t := range topics {
			md, err := c.GetMetadata(&t, false, 10000)
			if err != nil {
				return
			}
			partitions += len(md.Topics[t].Partitions)
		}
		if partitions > 0 {
			s.cfg.Logger.Warn("consumer group has more members than input partitions; the extra members idle",
				"group", s.cfg.GroupID, "partitions", partitions, "assigned", 0, "idle_for", idleFor,
				"hint", "run at most as many instances as the input topics have partitions")
		}
	})
}

func ktp(tp TopicPartition, off kafka.Offset) kafka.TopicPartition {
	t := tp.Topic
	return kafka.TopicPartition{Topic: &t, Partition: tp.Partition, Offset: off}
}

func claimEpoch(c *store.Claim) int64 {
	if c == nil {
		return 0
	}
	return c.Epoch
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}
