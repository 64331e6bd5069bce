package actors

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// closingConsumer is a consumer that was never subscribed: its Close
// returns at once, and the test serves the revoke callback that a real
// Close would run, on a goroutine of its own as Close does.
func closingConsumer(t *testing.T) *kafka.Consumer {
	t.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": "127.0.0.1:1", "group.id": "close-test",
		"log_level": 0})
	if err != nil {
		t.Fatalf("new consumer: %v", err)
	}
	return c
}

// TestStopRetiresAConsumerWhoseCallbackIsStuckInLibrdkafka is chaos seed
// 48: a stop abandoned Close at its deadline while the revoke callback
// Close was running sat in rd_kafka_incremental_unassign, holding the lock
// that keeps callbacks and the stop apart. The stop then waited on that
// lock without a bound, and the member outlived shutdown.timeout. The stop
// must retire the consumer within its deadline, and the callback, when
// librdkafka lets it go, must touch nothing of the supervisor's state.
func TestStopRetiresAConsumerWhoseCallbackIsStuckInLibrdkafka(t *testing.T) {
	sys, committer, _, m := newTestCommitter(t, time.Hour)
	s := NewSupervisor(sys, SupervisorConfig{Committer: committer, DrainTimeout: 2 * time.Second,
		Metrics: m, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Commits: NewCommitGate()})
	c := closingConsumer(t)
	s.consumer = c
	s.current.Store(c)

	entered, release := make(chan struct{}), make(chan struct{})
	s.incrementalUnassign = func(*kafka.Consumer, []kafka.TopicPartition) error {
		close(entered)
		<-release // librdkafka answering never, for as long as the test says
		return nil
	}
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})

	// The stop: partitions drained and committed, then Close, which
	// serves one more revoke.
	s.stopping, s.deadline = true, time.Now().Add(time.Second)
	topic := "events"
	revoked := []kafka.TopicPartition{{Topic: &topic, Partition: 0}, {Topic: &topic, Partition: 1}}
	callbackDone := make(chan struct{})
	go func() { // Close's goroutine
		defer close(callbackDone)
		_ = s.rebalance(c, kafka.RevokedPartitions{Partitions: revoked})
	}()
	<-entered

	closed := make(chan time.Duration)
	go func() {
		began := time.Now()
		s.closeConsumer(time.Now().Add(time.Second))
		closed <- time.Since(began)
	}()
	select {
	case took := <-closed:
		// Close itself returns at once here; retiring the consumer must
		// not wait for the callback.
		if took > 2*time.Second {
			t.Errorf("closeConsumer took %s with the callback stuck in librdkafka", took)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("closeConsumer still waiting 15 s after the callback got stuck in librdkafka (the stop has no bound)")
	}
	if s.current.Load() != nil || s.consumer != nil {
		t.Fatal("the consumer was not retired")
	}

	// What the stop does next, on the poll loop's state; the callback
	// must not see or change any of it.
	s.stopping, s.deadline = false, time.Time{}
	m.Assigned.Set(7)

	close(release)
	select {
	case <-callbackDone:
	case <-time.After(15 * time.Second):
		t.Fatal("the callback did not return once librdkafka let it go")
	}
	if !s.waitSince.IsZero() {
		t.Errorf("the retired consumer's callback started an assignment wait (%s) on the supervisor", s.waitFrom)
	}
	if n := testutil.ToFloat64(m.Assigned); n != 7 {
		t.Errorf("the retired consumer's callback set ratchet_partitions_assigned to %v", n)
	}
	// The lock is free again: a callback of the next consumer runs.
	if !s.callbacks.TryLock() {
		t.Fatal("the callbacks lock is still held after the callback returned")
	}
	s.callbacks.Unlock()
}

// TestRetiredConsumerCallbackDoesNotHoldTheSupervisor: a callback of a
// consumer already retired only answers librdkafka, and must not hold the
// lock while it does: librdkafka may keep it there, and the next
// consumer's callbacks need the lock.
func TestRetiredConsumerCallbackDoesNotHoldTheSupervisor(t *testing.T) {
	sys, committer, _, m := newTestCommitter(t, time.Hour)
	s := NewSupervisor(sys, SupervisorConfig{Committer: committer, DrainTimeout: 2 * time.Second,
		Metrics: m, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	old := closingConsumer(t)
	defer old.Close()

	entered, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	s.incrementalUnassign = func(*kafka.Consumer, []kafka.TopicPartition) error {
		close(entered)
		<-release
		return nil
	}
	go func() { _ = s.rebalance(old, kafka.RevokedPartitions{}) }() // old is not current: retired
	<-entered
	if !s.callbacks.TryLock() {
		t.Fatal("a retired consumer's callback holds the callbacks lock while librdkafka keeps it")
	}
	s.callbacks.Unlock()
}
