package actors

import (
	"errors"
	"sync"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// ErrNoConsumer is a commit made while there is no consumer to make it
// through (between a Close and the next consumer).
var ErrNoConsumer = errors.New("no consumer")

// ErrConsumerClosing is a commit refused because the consumer is being
// closed and no rebalance callback of that Close is running.
var ErrConsumerClosing = errors.New("consumer closing")

// settleAfter is how long a commit must have been in flight before a Close
// may go on without waiting for it: rd_kafka_commit queues its request to
// the group before anything else, and the group serves its queue in order.
const settleAfter = 100 * time.Millisecond

// CommitGate is the committer's way to the consumer, and it keeps commits
// away from a consumer's Close. librdkafka takes an application's commit
// during Close safely only while a rebalance callback of that Close is
// running (the group waits for the callback's assign call). Any other
// commit can reach the group after it has decided to terminate, and
// librdkafka aborts the whole process (rd_kafka_cgrp_terminated asserts
// that no commit is in flight; librdkafka #4027). The committer's own
// commits (its timer, a flush whose answer a stop gave up on) come at any
// moment, so from the start of a Close the gate lets commits through only
// inside a callback's window, which closes before the callback's own
// librdkafka call; each close of the window waits (bounded) for the
// commits in flight to have reached the group (settleAfter).
//
// A nil gate commits nothing (ErrNoConsumer).
type CommitGate struct {
	mu      sync.Mutex
	c       *kafka.Consumer
	closing bool // Close has begun
	window  bool // a callback of that Close is running, before its librdkafka call
	flights map[uint64]time.Time
	next    uint64
	ended   chan struct{} // closed and replaced when a commit ends
}

// NewCommitGate returns a gate with no consumer.
func NewCommitGate() *CommitGate {
	return &CommitGate{flights: make(map[uint64]time.Time), ended: make(chan struct{})}
}

// CommitOffsets commits offsets through the current consumer, unless
// there is none or it is closing outside a callback's window.
func (g *CommitGate) CommitOffsets(offsets []kafka.TopicPartition) ([]kafka.TopicPartition, error) {
	if g == nil {
		return nil, ErrNoConsumer
	}
	g.mu.Lock()
	c := g.c
	switch {
	case c == nil:
		g.mu.Unlock()
		return nil, ErrNoConsumer
	case g.closing && !g.window:
		g.mu.Unlock()
		return nil, ErrConsumerClosing
	}
	id := g.next
	g.next++
	g.flights[id] = time.Now()
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		delete(g.flights, id)
		close(g.ended)
		g.ended = make(chan struct{})
		g.mu.Unlock()
	}()
	return c.CommitOffsets(offsets)
}

// open makes c the consumer commits go through.
func (g *CommitGate) open(c *kafka.Consumer) {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.c, g.closing, g.window = c, false, false
	g.mu.Unlock()
}

// beginClose is called before Close: from now on only a callback's window
// lets commits through. It returns once the commits in flight have
// reached the group, or at deadline.
func (g *CommitGate) beginClose(deadline time.Time) bool {
	if g == nil {
		return true
	}
	g.mu.Lock()
	g.closing, g.window = true, false
	g.mu.Unlock()
	return g.settle(deadline)
}

// openWindow is called when a rebalance callback of the current consumer
// begins: while Close runs, the callback's commits are safe until its
// librdkafka call.
func (g *CommitGate) openWindow() {
	if g == nil {
		return
	}
	g.mu.Lock()
	if g.closing {
		g.window = true
	}
	g.mu.Unlock()
}

// closeWindow is called before a callback's librdkafka call (assign or
// unassign); while Close runs it shuts the window and waits, until
// deadline, for the commits in flight to reach the group.
func (g *CommitGate) closeWindow(deadline time.Time) bool {
	if g == nil {
		return true
	}
	g.mu.Lock()
	closing := g.closing
	g.window = false
	g.mu.Unlock()
	if !closing {
		return true
	}
	return g.settle(deadline)
}

// shut forgets the consumer: Close has returned or was abandoned.
func (g *CommitGate) shut() {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.c, g.closing, g.window = nil, false, false
	g.mu.Unlock()
}

// settle waits until every commit in flight has ended or has been in
// flight for settleAfter, or until deadline; it reports whether they had.
func (g *CommitGate) settle(deadline time.Time) bool {
	for {
		g.mu.Lock()
		var youngest time.Time
		for _, at := range g.flights {
			if at.After(youngest) {
				youngest = at
			}
		}
		ended := g.ended
		g.mu.Unlock()
		if youngest.IsZero() {
			return true
		}
		ready := youngest.Add(settleAfter)
		if !ready.After(time.Now()) {
			return true
		}
		wait := time.NewTimer(time.Until(minTime(ready, deadline)))
		select {
		case <-ended:
			wait.Stop()
		case <-wait.C:
			if !deadline.After(time.Now()) {
				return false
			}
		}
	}
}
