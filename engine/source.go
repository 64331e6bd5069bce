package engine

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/actors"
	"ratchet/config"
	"ratchet/internal/store"
	"ratchet/internal/web"
	"ratchet/processor/dashboard"
)

// source is what the page and the probes read: the supervisor's board and
// the dashboard table.
type source struct {
	cfg   config.Config
	owner string
	board *actors.Board
	pool  *pgxpool.Pool
	guard *actors.Guard // partitions held for a configuration error or a tripped pipeline
}

func (s *source) Pipeline(ctx context.Context) (web.Pipeline, error) {
	p := web.Pipeline{Instance: s.owner, Group: s.cfg.Kafka.GroupID, Mode: s.cfg.Commit.Mode}
	for _, ps := range s.board.Partitions() {
		stored := int64(-1)
		if s.cfg.Commit.Mode == config.ModeExactlyOnce {
			stored = ps.Next
		}
		p.Partitions = append(p.Partitions, web.PartitionStatus{
			Topic: ps.Topic, Partition: ps.Partition, Owner: s.owner, Assigned: true,
			StoredOffset: stored, CommittedOffset: ps.Committed, EndOffset: ps.End, Lag: ps.Lag,
			Records: ps.Records, Retries: ps.Retries, DeadLetters: ps.DeadLetter, Restarts: ps.Restarts,
			RatePerSec: ps.RatePerSec, Paused: ps.Paused,
		})
	}
	return p, nil
}

func (s *source) Rollups(ctx context.Context, since time.Time) ([]web.Rollup, error) {
	rows, err := dashboard.Read(ctx, s.pool, since)
	if err != nil {
		return nil, fmt.Errorf("read rollups: %w", err)
	}
	out := make([]web.Rollup, len(rows))
	for i, r := range rows {
		out[i] = web.Rollup{Metric: r.Metric, Bucket: r.Bucket, Count: r.Count, Sum: r.Sum, Min: r.Min, Max: r.Max}
	}
	return out, nil
}

// deadLetterPanelRows bounds the page's dead-letters panel.
const deadLetterPanelRows = 10

// DeadLetters implements web.DeadLetterSource. In exactly-once mode the
// reasons come from ratchet_dead_letters (every instance's, most recent
// first); in at-least-once mode nothing records them outside the DLQ, so
// the panel shows this instance's counts per topic, as the metrics do.
func (s *source) DeadLetters(ctx context.Context) ([]web.DeadLetterSummary, error) {
	if s.cfg.Commit.Mode != config.ModeExactlyOnce {
		counts := map[string]int64{}
		var topics []string
		for _, p := range s.board.Partitions() {
			if _, ok := counts[p.Topic]; !ok {
				topics = append(topics, p.Topic)
			}
			counts[p.Topic] += p.DeadLetter
		}
		slices.Sort(topics)
		out := []web.DeadLetterSummary{}
		for _, t := range topics {
			if counts[t] > 0 {
				out = append(out, web.DeadLetterSummary{Topic: t, Count: counts[t]})
			}
		}
		return out, nil
	}
	rows, err := store.DeadLetterReasons(ctx, s.pool, s.cfg.Kafka.GroupID, deadLetterPanelRows)
	if err != nil {
		return nil, err
	}
	out := make([]web.DeadLetterSummary, len(rows))
	for i, r := range rows {
		out[i] = web.DeadLetterSummary{Topic: r.Topic, Class: r.Class, Pipeline: r.Pipeline, SQLState: r.SQLState,
			Reason: r.Reason, Count: r.Count, Last: r.Last}
	}
	return out, nil
}

func (s *source) Readiness() web.Readiness {
	phase := s.board.Phase()
	switch phase {
	case actors.PhaseDraining, actors.PhaseStopped:
		return web.Readiness{State: web.StateDraining, Reason: "stopping: draining partitions"}
	}
	if waited, bound, ok := s.board.AssignmentWait(); ok {
		// Subscribed, or back in the join after losing the assignment:
		// say for how long, and when the consumer is rebuilt.
		reason := fmt.Sprintf("waiting for the consumer group to assign partitions for %s", waited.Round(time.Second))
		if bound > 0 {
			reason += fmt.Sprintf(" (the consumer is rebuilt after %s)", bound)
		}
		return web.Readiness{State: web.StateStarting, Reason: reason}
	}
	if phase == actors.PhaseStarting {
		return web.Readiness{State: web.StateStarting, Reason: "joining the consumer group"}
	}
	if n, why := s.board.Unclaimed(); n > 0 {
		return web.Readiness{State: web.StateDegraded,
			Reason: fmt.Sprintf("%d assigned partition(s) not claimed yet, retrying: %s", n, why)}
	}
	if why := s.guard.Reason(); why != "" {
		return web.Readiness{State: web.StateDegraded, Reason: why}
	}
	parts := s.board.Partitions()
	if len(parts) == 0 {
		return web.Readiness{State: web.StateIdle, Reason: "no partitions assigned"}
	}
	for _, p := range parts {
		if p.Degraded {
			return web.Readiness{State: web.StateDegraded,
				Reason: fmt.Sprintf("%s[%d]: retrying a transient failure", p.Topic, p.Partition)}
		}
	}
	return web.Readiness{State: web.StateReady}
}
