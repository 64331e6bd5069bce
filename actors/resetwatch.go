package actors

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"ratchet/internal/store"
)

// ResetWatch brings an offsets reset to a running exactly-once owner
// within about a second, even when no record arrives. Without it the owner
// learns of the move only when its next batch is refused by the offset
// guard, which on an idle partition may be never.
//
// It polls: once per Interval, one query per instance over the rows this
// instance owns (consumer_group, owner), compared with the position each
// partition actor believes. It deliberately does not LISTEN for a NOTIFY
// from the reset: LISTEN needs a database session of its own, which a
// transaction-mode pooler (PgBouncer, pgcat, RDS Proxy) does not give, and
// ratchet must work behind one. The poll is one plain statement in its own
// transaction (store.OwnedPositions).
//
// A difference is only a hint: the partition actor checks it against its
// own state (no batch in flight, the position it had when the query began,
// the same claim epoch) and, when it holds, takes the path a batch refused
// for a moved offset takes: the store is the truth, move the watermark
// there and read from it again.
type ResetWatch struct {
	cfg ResetWatchConfig

	mu    sync.Mutex
	parts map[TopicPartition]watchedPartition
}

// ResetWatchConfig configures a ResetWatch.
type ResetWatchConfig struct {
	// Root sends the hints to the partition actors.
	Root *actor.RootContext
	// Read returns the stored position and epoch of every partition this
	// instance owns (store.OwnedPositions).
	Read func(ctx context.Context) ([]store.OwnedPosition, error)
	// Interval is the time between two reads; zero means one second.
	Interval time.Duration
	Logger   *slog.Logger
}

// watchedPartition is one running partition actor as the watch knows it.
type watchedPartition struct {
	gen      uint64
	pid      *actor.PID
	epoch    int64
	progress *Progress
}

// storeMoved tells a partition actor that its stored position is not the
// one it believes: stored was read while the actor's published position
// was seen.
type storeMoved struct {
	gen          uint64
	epoch        int64
	seen, stored int64
}

// resetWatchReadTimeout bounds one read.
const resetWatchReadTimeout = 5 * time.Second

// resetWatchWarnEvery rate-limits the warning for failed reads.
const resetWatchWarnEvery = time.Minute

// NewResetWatch returns a watch; Run polls.
func NewResetWatch(cfg ResetWatchConfig) *ResetWatch {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &ResetWatch{cfg: cfg, parts: map[TopicPartition]watchedPartition{}}
}

// track registers a running partition actor; nil-safe (no watch: nothing).
func (w *ResetWatch) track(tp TopicPartition, gen uint64, pid *actor.PID, epoch int64, progress *Progress) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.parts[tp] = watchedPartition{gen: gen, pid: pid, epoch: epoch, progress: progress}
}

// untrack forgets the actor of assignment gen of tp, not a newer one.
func (w *ResetWatch) untrack(tp TopicPartition, gen uint64) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if p, ok := w.parts[tp]; ok && p.gen == gen {
		delete(w.parts, tp)
	}
}

// Run reads and compares once per Interval until ctx is done. A failed
// read concludes nothing: the next one tries again (warned about once a
// minute at most).
func (w *ResetWatch) Run(ctx context.Context) {
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	var warned time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := w.check(ctx); err != nil && ctx.Err() == nil && time.Since(warned) >= resetWatchWarnEvery {
			warned = time.Now()
			w.cfg.Logger.Warn("cannot read the stored offsets to look for a reset; retrying", "err", err)
		}
	}
}

// check does one round: note what every partition believes, read the
// rows, and hint each partition whose row says otherwise under its own
// epoch.
func (w *ResetWatch) check(ctx context.Context) error {
	w.mu.Lock()
	if len(w.parts) == 0 {
		w.mu.Unlock()
		return nil // nothing owned: no query
	}
	type seen struct {
		watchedPartition
		next int64
	}
	snap := make(map[TopicPartition]seen, len(w.parts))
	for tp, p := range w.parts {
		// Read before the query: a batch applied while it runs changes
		// what the actor believes, and the actor then ignores the hint.
		snap[tp] = seen{watchedPartition: p, next: p.progress.Next.Load()}
	}
	w.mu.Unlock()

	rctx, cancel := context.WithTimeout(ctx, min(resetWatchReadTimeout, w.cfg.Interval*5))
	defer cancel()
	rows, err := w.cfg.Read(rctx)
	if err != nil {
		return err
	}
	for _, r := range rows {
		s, ok := snap[TopicPartition{Topic: r.Topic, Partition: r.Partition}]
		if !ok || r.Epoch != s.epoch || r.Next == s.next {
			continue // not running here, claimed again (the fence's business), or as believed
		}
		w.cfg.Root.Send(s.pid, &storeMoved{gen: s.gen, epoch: s.epoch, seen: s.next, stored: r.Next})
	}
	return nil
}

// storeMoved applies a hint of the ResetWatch when it still holds: the
// claim is this actor's, nothing is in flight (a batch in flight is either
// applied, and moved the row itself, or refused by the offset guard, which
// moves the watermark), and the watermark is still the one the watch saw
// before it read the row.
func (p *Partition) storeMoved(c actor.Context, m *storeMoved) {
	if p.cfg.Claim == nil || m.gen != p.cfg.Gen || m.epoch != p.epoch() || p.state.fenced || p.state.draining ||
		p.inFlight != nil || p.state.next != m.seen || m.stored == p.state.next {
		return
	}
	p.log().Info("stored offset moved (offsets reset); resuming from it", "offset", p.state.next,
		"stored_offset", m.stored, "epoch", p.epoch())
	p.state.next = m.stored
	p.cfg.Progress.Next.Store(m.stored)
	c.Send(p.cfg.Committer, &OffsetMoved{TP: p.cfg.TP, Gen: p.cfg.Gen, Next: m.stored})
	p.rewind(c)
}
