package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/actors"
	"ratchet/config"
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

func (s *source) Readiness() web.Readiness {
	switch s.board.Phase() {
	case actors.PhaseStarting:
		return web.Readiness{State: web.StateStarting, Reason: "joining the consumer group"}
	case actors.PhaseDraining, actors.PhaseStopped:
		return web.Readiness{State: web.StateDraining, Reason: "stopping: draining partitions"}
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
