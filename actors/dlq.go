package actors

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/processor"
)

// DLQ headers (a contract: tools that replay dead letters read them).
const (
	HeaderError     = "ratchet.error"
	HeaderTopic     = "ratchet.topic"
	HeaderPartition = "ratchet.partition"
	HeaderOffset    = "ratchet.offset"
	HeaderAttempts  = "ratchet.attempts"
	HeaderFailedAt  = "ratchet.failed_at"
)

// Letter is one record for the dead-letter topic.
type Letter struct {
	Record   processor.Record
	Reason   error
	Attempts int
	FailedAt time.Time
	DLQTopic string // filled in by the DLQ actor
}

// DLQConfig configures the DLQ actor.
type DLQConfig struct {
	// Producer is owned by the actor from now on: it drains its events and
	// closes it when it stops.
	Producer *kafka.Producer
	// Topic returns the dead-letter topic of an input topic.
	Topic   func(input string) string
	Backoff RetryPolicy
	Logger  *slog.Logger
}

// deadLetterRequest asks the DLQ actor to write letters. Sent by a retry
// actor's DeadLetter call with RequestFuture; the reply is *deadLettered,
// sent once every letter is acknowledged by the broker.
type deadLetterRequest struct {
	letters []Letter
}

// deadLettered answers deadLetterRequest: every letter is durable.
type deadLettered struct{ letters []Letter }

// delivered carries one delivery report from the producer's event loop to
// the DLQ actor.
type delivered struct{ msg *kafka.Message }

// reproduce re-sends a letter whose delivery failed, after a backoff.
type reproduce struct {
	item *dlqItem
}

type dlqItem struct {
	req      *dlqPending
	idx      int
	attempts int
}

type dlqPending struct {
	sender    *actor.PID
	letters   []Letter
	remaining int
}

// DLQ owns the dead-letter producer. It writes the original key and value
// with the ratchet.* headers, waits for each delivery report, and only then
// answers, so a partition's offset never passes a record before it is
// durable in the dead-letter topic. A write that fails is retried with
// backoff for as long as it takes: the partition waits, nothing is dropped.
// Requests from different partitions are in flight at once.
type DLQ struct {
	cfg     DLQConfig
	events  chan struct{} // closed when the event loop ended
	stopped bool
}

// NewDLQ returns the DLQ actor's producer.
func NewDLQ(cfg DLQConfig) actor.Producer {
	return func() actor.Actor { return &DLQ{cfg: cfg} }
}

// Receive implements actor.Actor.
func (d *DLQ) Receive(c actor.Context) {
	switch msg := c.Message().(type) {
	case *actor.Started:
		d.events = make(chan struct{})
		self, root := c.Self(), c.ActorSystem().Root
		go func() { // ends when the producer is closed (Events is closed)
			defer close(d.events)
			for ev := range d.cfg.Producer.Events() {
				if m, ok := ev.(*kafka.Message); ok {
					root.Send(self, &delivered{msg: m})
				}
			}
		}()
	case *deadLetterRequest:
		p := &dlqPending{sender: c.Sender(), letters: msg.letters, remaining: len(msg.letters)}
		for i := range p.letters {
			p.letters[i].DLQTopic = d.cfg.Topic(p.letters[i].Record.Topic)
			d.produce(c, &dlqItem{req: p, idx: i})
		}
		if p.remaining == 0 {
			c.Send(p.sender, &deadLettered{})
		}
	case *delivered:
		item, ok := msg.msg.Opaque.(*dlqItem)
		if !ok {
			return
		}
		if err := msg.msg.TopicPartition.Error; err != nil {
			d.retryLater(c, item, err)
			return
		}
		item.req.remaining--
		if item.req.remaining == 0 {
			c.Send(item.req.sender, &deadLettered{letters: item.req.letters})
		}
	case *reproduce:
		if !d.stopped {
			d.produce(c, msg.item)
		}
	case *actor.Stopping:
		d.stopped = true
		// Whatever is still queued gets up to 10s; a partition waiting on
		// it never committed past it, so nothing is lost either way.
		d.cfg.Producer.Flush(10_000)
		d.cfg.Producer.Close()
		<-d.events
	}
}

func (d *DLQ) produce(c actor.Context, item *dlqItem) {
	l := item.req.letters[item.idx]
	item.attempts++
	topic := l.DLQTopic
	r := l.Record
	// The original headers first, then ratchet's, and the original
	// timestamp: `ratchet dlq replay` re-produces the record as it was.
	headers := make([]kafka.Header, 0, len(r.Headers)+6)
	for _, h := range r.Headers {
		headers = append(headers, kafka.Header{Key: h.Key, Value: h.Value})
	}
	headers = append(headers,
		kafka.Header{Key: HeaderError, Value: []byte(truncate(l.Reason.Error(), 1000))},
		kafka.Header{Key: HeaderTopic, Value: []byte(r.Topic)},
		kafka.Header{Key: HeaderPartition, Value: []byte(strconv.FormatInt(int64(r.Partition), 10))},
		kafka.Header{Key: HeaderOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
		kafka.Header{Key: HeaderAttempts, Value: []byte(strconv.Itoa(l.Attempts))},
		kafka.Header{Key: HeaderFailedAt, Value: []byte(l.FailedAt.UTC().Format(time.RFC3339Nano))},
	)
	msg := &kafka.Message{
		TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
		Key:            r.Key,
		Value:          r.Value,
		Timestamp:      r.Timestamp,
		Headers:        headers,
		Opaque:         item,
	}
	if err := d.cfg.Producer.Produce(msg, nil); err != nil {
		d.retryLater(c, item, err)
	}
}

func (d *DLQ) retryLater(c actor.Context, item *dlqItem, err error) {
	l := item.req.letters[item.idx]
	wait := d.cfg.Backoff.Backoff(min(item.attempts, 20))
	d.cfg.Logger.Warn("dead-letter write failed; retrying", "actor", "dlq", "topic", l.Record.Topic,
		"partition", l.Record.Partition, "offset", l.Record.Offset, "dlq_topic", l.DLQTopic,
		"attempt", item.attempts, "wait", wait.String(), "err", err)
	self, root := c.Self(), c.ActorSystem().Root
	time.AfterFunc(wait, func() { root.Send(self, &reproduce{item: item}) })
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// DLQClient is the DeadLetterer the retry actors use: it asks the DLQ actor
// and waits for every delivery.
type DLQClient struct {
	Root *actor.RootContext
	PID  *actor.PID
}

// DeadLetter implements DeadLetterer.
func (d DLQClient) DeadLetter(ctx context.Context, letters []Letter) error {
	if len(letters) == 0 {
		return nil
	}
	f := d.Root.RequestFuture(d.PID, &deadLetterRequest{letters: letters}, -1)
	done := make(chan error, 1)
	go func() { // ends when the future completes (the DLQ answers or stops)
		res, err := f.Result()
		if err == nil {
			if _, ok := res.(*deadLettered); !ok {
				err = fmt.Errorf("dead letter: unexpected reply %T", res)
			}
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// DiscardDLQ is a DeadLetterer for processors run without a dead-letter
// topic (tests, library use): the record is only logged and counted.
type DiscardDLQ struct{}

// DeadLetter implements DeadLetterer.
func (DiscardDLQ) DeadLetter(context.Context, []Letter) error { return nil }
