package actors

import (
	"errors"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// Commits and the group protocol (classic protocol, cooperative-sticky,
// static or dynamic members; librdkafka 2.11.1, Apache Kafka's and kfake's
// classic coordinator).
//
// Which OffsetCommit the group coordinator refuses:
//
//   - REBALANCE_IN_PROGRESS: the group is CompletingRebalance (every member
//     has rejoined, SyncGroup has not finished). Refused whatever the
//     generation.
//   - ILLEGAL_GENERATION: the request carries a generation the group has
//     left behind (a rebalance completed without this member having seen
//     it yet).
//   - UNKNOWN_MEMBER_ID: the member left (LeaveGroup, also the one Close
//     sends) or was expired (session or rebalance timeout).
//   - NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS:
//     the coordinator moved or is loading the group; librdkafka looks it up
//     again.
//   - Accepted: Empty, PreparingRebalance and Stable with the current
//     generation. A group preparing a rebalance still takes commits of the
//     generation it is leaving, until every member has rejoined.
//
// What that means for a member that must commit before it gives partitions
// up:
//
//  1. A commit does not overtake the member's own JoinGroup. The broker
//     answers one request at a time per connection (Apache Kafka mutes the
//     channel; kfake serves it in order), and JoinGroup, SyncGroup,
//     Heartbeat, OffsetCommit and LeaveGroup share the coordinator
//     connection. librdkafka rejoins by itself, from its own thread,
//     whether or not the application polls; the coordinator holds that
//     JoinGroup until every member has rejoined. A commit sent meanwhile
//     waits behind it and is then answered REBALANCE_IN_PROGRESS, or it
//     times out (socket.timeout.ms). So does Close's LeaveGroup: that is
//     why a stop that kept committing without polling used to hang in
//     Close until shutdown.timeout.
//  2. The group only completes a rebalance when every member rejoins, and a
//     member that waits for its rebalance callback to be served does not
//     rejoin. A member that stops polling while it drains or commits
//     therefore holds up the whole group, including the other stopping
//     members, whose commits wait behind their JoinGroups in turn.
//  3. Inside the rebalance callback the member holds the generation the
//     group has just completed (SyncGroup is done), and librdkafka sends no
//     JoinGroup until the callback returns (a heartbeat that reports a new
//     rebalance is ignored while an assign or revoke call is pending). A
//     commit made there is accepted: the group is Stable, or
//     PreparingRebalance waiting for this very member. The revoke callback
//     is where a revoke commits, and the assign callback is where a stop
//     whose commit was refused commits again.
//  4. An OffsetCommit answered UNKNOWN_MEMBER_ID, or ILLEGAL_GENERATION
//     outside a rebalance, makes librdkafka declare the assignment lost and
//     revoke it with AssignmentLost set. Another member may own those
//     partitions already, so nothing of them is committed then; the applied
//     watermarks are remembered, and if a partition comes back to this
//     member, it resumes from (and commits) the higher of Kafka's committed
//     offset and what it applied: every record below either was applied.
//
// Hence the stop (Supervisor.stop): pause every partition and drop what
// is fetched, drain the partition actors while polling, commit while
// polling, and when the group refuses the commit, keep polling until the
// next rebalance callback, where the commit is made again under the new
// generation. Only the stop's deadline abandons a commit; every partition
// left uncommitted then is logged and counted. Close comes last, with what
// is left of shutdown.timeout; by then there is nothing left to commit.

// GroupRefusal reports whether err (from CommitOffsets, or a partition's
// error in its result) is the group coordinator refusing a commit for a
// reason the group protocol resolves by itself once the member has rejoined
// or found the coordinator again. It returns the reason as a metric label
// value (group_rebalancing, group_generation, group_unknown_member,
// group_coordinator), or "" for any other error.
func GroupRefusal(err error) string {
	if err == nil {
		return ""
	}
	var reason string
	visit(err, func(e error) bool {
		var ke kafka.Error
		if !errors.As(e, &ke) {
			return false
		}
		switch ke.Code() {
		case kafka.ErrRebalanceInProgress:
			reason = "group_rebalancing"
		case kafka.ErrIllegalGeneration:
			reason = "group_generation"
		case kafka.ErrUnknownMemberID:
			reason = "group_unknown_member"
		case kafka.ErrNotCoordinator, kafka.ErrCoordinatorNotAvailable, kafka.ErrCoordinatorLoadInProgress,
			kafka.ErrWaitCoord:
			reason = "group_coordinator"
		default:
			return false
		}
		return true
	})
	return reason
}

// visit calls f on err and on every error it wraps or joins, until f
// returns true.
func visit(err error, f func(error) bool) bool {
	if err == nil {
		return false
	}
	if f(err) {
		return true
	}
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if visit(e, f) {
				return true
			}
		}
	case interface{ Unwrap() error }:
		return visit(u.Unwrap(), f)
	}
	return false
}

// commitResult is the commits metric's result label for a failed commit:
// the group refusal's reason, else fallback (error or partial).
func commitResult(err error, fallback string) string {
	switch {
	case errors.Is(err, ErrNoConsumer):
		return "no_consumer"
	case errors.Is(err, ErrConsumerClosing):
		return "closing"
	}
	if r := GroupRefusal(err); r != "" {
		return r
	}
	return fallback
}
