package chaos

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// classicMember speaks the classic group protocol to the test broker by
// hand, one request at a time on its own connection, as a librdkafka
// member does on its coordinator connection.
type classicMember struct {
	t        *testing.T
	cl       *kgo.Client
	instance string
	memberID string
	gen      int32
}

func newClassicMember(t *testing.T, addr, instance string) *classicMember {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ClientID(instance))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &classicMember{t: t, cl: cl, instance: instance}
}

// join sends one JoinGroup and returns its answer (or ctx's error when the
// broker never answers).
func (m *classicMember) join(ctx context.Context) (*kmsg.JoinGroupResponse, error) {
	req := kmsg.NewPtrJoinGroupRequest()
	req.Group = "g"
	req.SessionTimeoutMillis = 6000
	req.RebalanceTimeoutMillis = 60000
	req.ProtocolType = "consumer"
	req.MemberID = m.memberID
	req.InstanceID = kmsg.StringPtr(m.instance)
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = []string{"events"}
	req.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "cooperative-sticky", Metadata: meta.AppendTo(nil)}}
	resp, err := req.RequestWith(ctx, m.cl)
	if err != nil {
		return nil, err
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return resp, err
	}
	m.memberID, m.gen = resp.MemberID, resp.Generation
	return resp, nil
}

// sync sends SyncGroup; the leader hands everyone an empty assignment.
func (m *classicMember) sync(ctx context.Context, leader bool, members []kmsg.JoinGroupResponseMember) error {
	req := kmsg.NewPtrSyncGroupRequest()
	req.Group, req.MemberID, req.Generation = "g", m.memberID, m.gen
	req.InstanceID = kmsg.StringPtr(m.instance)
	req.ProtocolType, req.Protocol = kmsg.StringPtr("consumer"), kmsg.StringPtr("cooperative-sticky")
	if leader {
		for _, jm := range members {
			req.GroupAssignment = append(req.GroupAssignment, kmsg.SyncGroupRequestGroupAssignment{MemberID: jm.MemberID})
		}
	}
	resp, err := req.RequestWith(ctx, m.cl)
	if err != nil {
		return err
	}
	return kerr.ErrorForCode(resp.ErrorCode)
}

func (m *classicMember) heartbeat(ctx context.Context) error {
	req := kmsg.NewPtrHeartbeatRequest()
	req.Group, req.MemberID, req.Generation = "g", m.memberID, m.gen
	req.InstanceID = kmsg.StringPtr(m.instance)
	resp, err := req.RequestWith(ctx, m.cl)
	if err != nil {
		return err
	}
	return kerr.ErrorForCode(resp.ErrorCode)
}

// TestBrokerDropsMembersWaitingInJoin documents a deviation of the test
// broker (kfake) from Apache Kafka, found by the chaos explorer's stall
// (docs/testing.md, "Where the test broker differs"). A member that has
// rejoined and waits in JoinGroup sends no heartbeats; Apache Kafka keeps
// such a member alive until the rebalance completes (bounded by the
// rebalance timeout) and always answers its JoinGroup. kfake keeps the
// session timer of the member's last heartbeat running: when it fires,
// the member is removed and its JoinGroup is never answered, so a
// librdkafka member waits for the answer until its request times out
// (max.poll.interval.ms + 5 s: five minutes by default) — a consumer that
// is "subscribed and then nothing". It happens whenever another member
// takes longer than a session timeout to rejoin while it keeps
// heartbeating, as a ratchet member whose revoke drains a batch against a
// slow or cut PostgreSQL does.
//
// The test asserts the deviation, so that it fails (and the docs and the
// explorer's verdict get updated) the day the broker behaves like Kafka.
func TestBrokerDropsMembersWaitingInJoin(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "events"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	addr := c.ListenAddrs()[0]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	a, b := newClassicMember(t, addr, "a"), newClassicMember(t, addr, "b")
	// a forms the group alone, then b joins and both settle.
	resp, err := a.join(ctx)
	if err != nil {
		t.Fatalf("a joins: %v", err)
	}
	if err := a.sync(ctx, true, resp.Members); err != nil {
		t.Fatalf("a syncs: %v", err)
	}
	bJoined := make(chan *kmsg.JoinGroupResponse, 1)
	go func() { r, _ := b.join(ctx); bJoined <- r }() // answered once a rejoins
	testEventually(t, func() bool { return errors.Is(a.heartbeat(ctx), kerr.RebalanceInProgress) }, "a sees the rebalance")
	resp, err = a.join(ctx)
	if err != nil {
		t.Fatalf("a rejoins: %v", err)
	}
	br := <-bJoined
	if br == nil {
		t.Fatal("b's join was not answered")
	}
	syncs := make(chan error, 2)
	go func() { syncs <- b.sync(ctx, false, nil) }()
	syncs <- a.sync(ctx, resp.LeaderID == a.memberID, resp.Members)
	if err := <-syncs; err != nil {
		t.Fatalf("sync: %v", err)
	}

	// A third member joins. a rejoins at once and waits in JoinGroup; b
	// keeps heartbeating (it is busy revoking) and rejoins after 8 s, past
	// a's 6 s session timeout.
	cm := newClassicMember(t, addr, "c")
	go func() { _, _ = cm.join(ctx) }() // answered when the rebalance completes
	testEventually(t, func() bool { return errors.Is(a.heartbeat(ctx), kerr.RebalanceInProgress) }, "a sees the second rebalance")
	aJoin := make(chan error, 1)
	go func() {
		jctx, jcancel := context.WithTimeout(ctx, 20*time.Second)
		defer jcancel()
		_, err := a.join(jctx)
		aJoin <- err
	}()
	bRejoinAt := time.Now().Add(8 * time.Second)
	for time.Now().Before(bRejoinAt) {
		_ = b.heartbeat(ctx)
		time.Sleep(time.Second) // b's heartbeat interval
	}
	go func() { _, _ = b.join(ctx) }() // b rejoins after its revoke

	err = <-aJoin
	info := c.GroupInfo("g")
	inGroup := false
	for _, m := range info.Members {
		if m.InstanceID != nil && *m.InstanceID == "a" {
			inGroup = true
		}
	}
	if err == nil {
		t.Fatalf("a's JoinGroup was answered: the broker now keeps members that wait in a join alive, as Apache Kafka does; update docs/testing.md and the explorer's stall verdict")
	}
	if !errors.Is(err, context.DeadlineExceeded) || inGroup {
		t.Fatalf("a's JoinGroup ended with %v (in group: %v); want it unanswered and a removed", err, inGroup)
	}
	t.Log("a waited in JoinGroup 20 s without an answer and is no longer a member")
}

func testEventually(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 15s: %s", what)
		}
		time.Sleep(50 * time.Millisecond) // polling the broker for the condition
	}
}
