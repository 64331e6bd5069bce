package actors

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/internal/testenv"
)

// TestCommitsDuringCloseNeitherHangNorReachTheGroup commits from four
// goroutines, as the committer's timer and a flush a stop gave up on do,
// while the consumer closes. A commit that reaches librdkafka once Close
// has begun, outside a rebalance callback of that Close, either waits for
// ever (the group's queue is gone) or, when it lands between the group's
// decision to terminate and its end, aborts the process (librdkafka #4027,
// a CI failure of engine's tests). Through the gate those commits are
// refused; the revoke callback of the Close commits, inside its window, and
// is taken. Without the refusal the close never settles here, and plain
// CommitOffsets calls made meanwhile never return.
func TestCommitsDuringCloseNeitherHangNorReachTheGroup(t *testing.T) {
	_, addr := testenv.Kafka(t, 4, "events")
	topic := "events"
	for round := range 8 {
		c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": addr, "group.id": fmt.Sprintf("gate-%d", round),
			"enable.auto.commit": false, "log_level": 0, "partition.assignment.strategy": "cooperative-sticky"})
		if err != nil {
			t.Fatalf("new consumer: %v", err)
		}
		gate := NewCommitGate()
		gate.open(c)
		var assigned, closing atomic.Bool
		var inRevoke, afterRevoke error
		revoked := make(chan struct{})
		err = c.SubscribeTopics([]string{topic}, func(c *kafka.Consumer, ev kafka.Event) error {
			// What Supervisor.rebalance and unlocked do.
			gate.openWindow()
			defer gate.closeWindow(time.Now())
			switch e := ev.(type) {
			case kafka.AssignedPartitions:
				gate.closeWindow(time.Now().Add(time.Second))
				_ = c.IncrementalAssign(e.Partitions)
				assigned.Store(true)
			case kafka.RevokedPartitions:
				if closing.Load() {
					_, inRevoke = gate.CommitOffsets([]kafka.TopicPartition{{Topic: &topic, Partition: 0, Offset: 7}})
				}
				gate.closeWindow(time.Now().Add(time.Second))
				_ = c.IncrementalUnassign(e.Partitions)
				if closing.Load() {
					_, afterRevoke = gate.CommitOffsets([]kafka.TopicPartition{{Topic: &topic, Partition: 0, Offset: 8}})
					close(revoked)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("subscribe: %v", err)
		}
		for !assigned.Load() {
			c.Poll(50)
		}

		stop := make(chan struct{})
		var wg sync.WaitGroup
		var taken, refused atomic.Int64
		for p := range int32(4) {
			wg.Go(func() {
				for n := int64(0); ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					_, err := gate.CommitOffsets([]kafka.TopicPartition{{Topic: &topic, Partition: p, Offset: kafka.Offset(n % 5)}})
					switch {
					case err == nil:
						taken.Add(1)
					case errors.Is(err, ErrConsumerClosing), errors.Is(err, ErrNoConsumer):
						refused.Add(1)
					}
				}
			})
		}
		testenv.Eventually(t, 10*time.Second, func() bool { return taken.Load() >= 4 }, "commits before the close")
		closing.Store(true)
		if !gate.beginClose(time.Now().Add(5 * time.Second)) {
			t.Fatalf("round %d: commits in flight did not settle", round)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("round %d: close: %v", round, err)
		}
		gate.shut()
		close(stop)
		ended := make(chan struct{})
		go func() { wg.Wait(); close(ended) }()
		select {
		case <-ended:
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: a commit made while the consumer closed never returned", round)
		}
		<-revoked
		if inRevoke != nil {
			t.Errorf("round %d: the revoke callback's commit inside Close: %v, want it taken", round, inRevoke)
		}
		if !errors.Is(afterRevoke, ErrConsumerClosing) {
			t.Errorf("round %d: a commit after the callback's unassign: %v, want %v", round, afterRevoke, ErrConsumerClosing)
		}
		if refused.Load() == 0 {
			t.Errorf("round %d: no commit was refused while the consumer closed", round)
		}
	}
}

// TestCommitGateSettles: a close waits for a commit that has only just
// been made (it may not have reached the group yet), not for one that
// has been on its way for settleAfter, and never past its deadline.
func TestCommitGateSettles(t *testing.T) {
	g := NewCommitGate()
	if !g.settle(time.Now()) {
		t.Fatal("nothing in flight: settled")
	}
	g.mu.Lock()
	g.flights[0] = time.Now()
	g.mu.Unlock()
	if g.settle(time.Now().Add(settleAfter / 10)) {
		t.Fatal("a commit made just now settled before its request can have been queued")
	}
	g.mu.Lock()
	g.flights[0] = time.Now().Add(-settleAfter)
	g.mu.Unlock()
	if !g.settle(time.Now()) {
		t.Fatal("a commit on its way for settleAfter did not settle")
	}
	g.mu.Lock()
	g.flights[1] = time.Now()
	g.mu.Unlock()
	go func() {
		g.mu.Lock()
		delete(g.flights, 1)
		close(g.ended)
		g.ended = make(chan struct{})
		g.mu.Unlock()
	}()
	if !g.settle(time.Now().Add(time.Minute)) {
		t.Fatal("the young commit ended: settled")
	}
	var nilGate *CommitGate
	if _, err := nilGate.CommitOffsets(nil); !errors.Is(err, ErrNoConsumer) {
		t.Fatalf("nil gate: %v, want %v", err, ErrNoConsumer)
	}
}
