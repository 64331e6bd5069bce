package actors

import (
	"fmt"
	"log/slog"
	"time"
)

// The assignment wait: the time a member spends subscribed without an
// assignment. It begins when a consumer subscribes and when a revoke
// leaves the member with no partition (a lost assignment, or an eager
// revoke of everything), and ends at the next assign callback, whatever
// it assigns: an empty assignment is an answer from the group, no wait.
//
// A healthy wait is short, but two kinds are long and silent in
// librdkafka: the group waits for a member that died without leaving
// (kill -9, OOM, a lost node) until its session expires, and a member
// whose JoinGroup the broker never answers waits until the request times
// out, max.poll.interval.ms + 5 s (five minutes by default; the test
// broker does that to a member it drops while it waits in the join,
// docs/testing.md). The poll loop therefore says what it waits for
// (joinInfoAfter, then past the session timeout) and, past
// SupervisorConfig.AssignmentTimeout, rebuilds the consumer: a new member
// with a new JoinGroup, logged and counted as a supervised restart of the
// consumer against the restart budget.

// joinInfoAfter is how long a wait lasts before it is logged: a join that
// finds the group stable takes a few hundred milliseconds, one that
// triggers a rebalance up to a heartbeat interval plus the other members'
// revokes.
const joinInfoAfter = 5 * time.Second

// rebuildAssignmentWait is the rebuild reason of the watchdog.
const rebuildAssignmentWait = "assignment_wait"

// AssignmentTimeout is how long a member may wait for an assignment
// before its consumer is rebuilt, for a group with the given session
// timeout (session.timeout.ms) whose members drain a revoke within drain
// (shutdown.timeout):
//
//	2 × session + drain
//
// A join that works waits for at most: a member that died without leaving,
// until its session expires (one session timeout); the live members to
// notice the rebalance at their next heartbeat and rejoin once their
// revoke has drained and committed (drain, plus a heartbeat interval,
// which is below the session timeout); the join and sync round trips.
// The second session timeout covers the heartbeat and the round trips
// with room to spare. With the defaults (30 s, 30 s) that is 90 s: past
// it, the member's JoinGroup or SyncGroup is not going to be answered.
func AssignmentTimeout(session, drain time.Duration) time.Duration {
	if session <= 0 {
		return 0
	}
	return 2*session + drain
}

// waitForAssignment starts the assignment wait, unless one is under way.
func (s *Supervisor) waitForAssignment(now time.Time, since string) {
	if !s.waitSince.IsZero() {
		return
	}
	s.waitSince, s.waitFrom, s.waitLogged = now, since, 0
	s.board.waitSince.Store(now.UnixNano())
	s.board.waitBound.Store(int64(s.cfg.AssignmentTimeout))
}

// assignmentCame ends the assignment wait (an assign callback).
func (s *Supervisor) assignmentCame(now time.Time) {
	if s.waitSince.IsZero() {
		return
	}
	if s.waitLogged > 0 {
		s.cfg.Logger.Info("consumer group assigned partitions after a long wait",
			"group", s.cfg.GroupID, "waited", now.Sub(s.waitSince).Round(time.Millisecond).String())
	}
	s.waitSince, s.waitFrom, s.waitLogged = time.Time{}, "", 0
	s.board.waitSince.Store(0)
	s.cfg.Metrics.AssignmentWait.Set(0)
}

// checkAssignmentWait logs a long assignment wait once at joinInfoAfter
// (INFO) and once past the session timeout (WARN), and past
// AssignmentTimeout returns the rebuild reason, or an error when the
// rebuild would exceed the restart budget. It runs in the poll loop.
func (s *Supervisor) checkAssignmentWait(now time.Time) (string, error) {
	if s.waitSince.IsZero() || s.stopping {
		return "", nil
	}
	waited := now.Sub(s.waitSince)
	s.cfg.Metrics.AssignmentWait.Set(waited.Seconds())
	bound, session := s.cfg.AssignmentTimeout, s.cfg.SessionTimeout
	switch {
	case bound > 0 && waited >= bound:
		return s.restartConsumer(now, waited)
	case s.waitLogged < 2 && session > 0 && waited >= session:
		s.waitLogged = 2
		s.cfg.Logger.Warn("still no partition assignment past the session timeout", s.waitAttrs(waited)...)
	case s.waitLogged < 1 && waited >= joinInfoAfter:
		s.waitLogged = 1
		s.cfg.Logger.Info("waiting for the consumer group to assign partitions", s.waitAttrs(waited)...)
	}
	return "", nil
}

// waitAttrs names what the group waits for and what shortens the wait.
func (s *Supervisor) waitAttrs(waited time.Duration) []any {
	attrs := []any{"group", s.cfg.GroupID, "since", s.waitFrom,
		"waited", waited.Round(time.Second).String(),
		"session_timeout", s.cfg.SessionTimeout.String()}
	if s.cfg.AssignmentTimeout > 0 {
		attrs = append(attrs, "rebuild_after", s.cfg.AssignmentTimeout.String())
	}
	if s.cfg.InstanceID == "" {
		return append(attrs,
			"waiting_for", "every member the group knows to rejoin, including the member of an instance that ended without leaving (kill -9, OOM, a lost node) until its session expires",
			"remedy", "set kafka.instance_id (static membership, as the Kubernetes manifests do with the pod name: a restarted instance takes its old member's place at once), or a shorter session.timeout.ms in kafka.properties")
	}
	return append(attrs, "instance_id", s.cfg.InstanceID,
		"waiting_for", "every member the group knows to rejoin; a member that ended for good is waited for until its session expires",
		"remedy", "a shorter session.timeout.ms in kafka.properties; check that the other instances are alive and polling")
}

// restartConsumer decides the watchdog's rebuild: a supervised restart of
// the consumer, counted against the restart budget (MaxRestarts within
// RestartWindow, the partition actors' budget). Past it the engine stops
// with an error, as it does for a partition actor over its budget: a
// group that keeps not assigning is not mended by rebuilding faster.
func (s *Supervisor) restartConsumer(now time.Time, waited time.Duration) (string, error) {
	kept := s.consumerRestarts[:0]
	for _, at := range s.consumerRestarts {
		if now.Sub(at) < s.cfg.RestartWindow {
			kept = append(kept, at)
		}
	}
	s.consumerRestarts = append(kept, now)
	n := len(s.consumerRestarts)
	reason := fmt.Sprintf("no partition assignment for %s (since %s; bound %s = 2 × session timeout + shutdown.timeout)",
		waited.Round(time.Second), s.waitFrom, s.cfg.AssignmentTimeout)
	log := s.cfg.Logger.With("actor", "consumer", "reason", reason, "restarts", n, "group", s.cfg.GroupID)
	if n > s.cfg.MaxRestarts {
		log.Error("consumer over its restart budget; stopping the engine",
			"budget", s.cfg.MaxRestarts, "window", s.cfg.RestartWindow.String())
		return "", fmt.Errorf("consumer over its restart budget: %s", reason)
	}
	s.cfg.Metrics.Restarts.WithLabelValues("consumer").Inc()
	log.Warn("consumer restarted: rebuilding it to rejoin the group", slog.String("rebuild", rebuildAssignmentWait))
	return rebuildAssignmentWait, nil
}

// AssignmentWait returns how long the member has waited for an assignment
// and the bound after which its consumer is rebuilt (0: none), or ok false
// when it is not waiting.
func (b *Board) AssignmentWait() (waited, bound time.Duration, ok bool) {
	since := b.waitSince.Load()
	if since == 0 {
		return 0, 0, false
	}
	return time.Since(time.Unix(0, since)), time.Duration(b.waitBound.Load()), true
}
