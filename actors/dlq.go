package actors

import (
	"errors"
	"log/slog"
	"strconv"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/internal/tracing"
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
	// HeaderReason is the reason class (ClassifyReason): decode,
	// expression, refused_by_postgres, ...
	HeaderReason = "ratchet.reason"
	// HeaderPipeline names the configured pipeline that refused the
	// record; absent when none did.
	HeaderPipeline = "ratchet.pipeline"
	// HeaderSQLState is PostgreSQL's SQLSTATE when it refused the record;
	// absent otherwise.
	HeaderSQLState = "ratchet.sqlstate"
)

// Letter is one record for the dead-letter topic.
type Letter struct {
	Record   processor.Record
	Reason   error
	Attempts int
	FailedAt time.Time
	DLQTopic string // filled in by the DLQ actor
	// batchStart is the first offset of the batch the record was cut or
	// isolated from: log lines about the letter name its batch with it.
	batchStart int64
	// decoding says the record was refused by the decoder when its batch
	// was cut, not by the processor or the database.
	decoding bool
	// Trace is the letter's `send` span (the zero Send with tracing off):
	// the dead letter carries its context as `traceparent`, in place of
	// the original record's. The sender ends it.
	Trace tracing.Send
}

// DLQConfig configures the DLQ actor.
type DLQConfig struct {
	// Producer is owned by the actor from now on: it drains its events and
	// closes it when it stops.
	Producer *kafka.Producer
	// Topic returns the dead-letter topic of an input topic.
	Topic   func(input string) string
	Backoff RetryPolicy
	// FlushBy returns when the flush of what is still queued must end once
	// the actor stops: the engine hands it what is left of shutdown.timeout.
	// Nil, or a zero time, gives the flush defaultFlush from the stop.
	FlushBy func() time.Time
	Logger  *slog.Logger
}

// defaultFlush bounds the flush on stop when DLQConfig.FlushBy says nothing.
const defaultFlush = 10 * time.Second

// ErrDLQStopped fails a dead-letter request the DLQ actor still held when
// it stopped or restarted: the letters may or may not be in the topic, and
// the partition must not pass them.
var ErrDLQStopped = errors.New("dlq stopped before every delivery was confirmed")

// deadLetterRequest asks the DLQ actor to write letters. Sent by a retry
// actor's DeadLetter call with RequestFuture; the reply is *deadLettered,
// sent once every letter is acknowledged by the broker.
type deadLetterRequest struct {
	letters []Letter
}

// deadLettered answers deadLetterRequest: every letter is durable.
type deadLettered struct{ letters []Letter }

// deadLetterFailed answers deadLetterRequest when the DLQ actor gives up
// on it: it stopped or restarted (ErrDLQStopped), or the request was
// cancelled.
type deadLetterFailed struct{ err error }

// cancelDeadLetter tells the DLQ actor that nobody waits for req any more
// (the caller's context ended, or its wait timed out): it stops retrying
// req's letters and answers req with a failure, which ends the waiting
// future. Sent by DLQClient.
type cancelDeadLetter struct{ req *deadLetterRequest }

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
	key       *deadLetterRequest // its key in DLQ.pending
	sender    *actor.PID
	letters   []Letter
	remaining int
	done      bool // answered or cancelled: its reports and retries are ignored
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
	// pending holds every request not yet answered, so that each one is
	// answered (or failed) whatever happens: a request left unanswered
	// holds its caller's goroutine.
	pending map[*deadLetterRequest]*dlqPending
}

// NewDLQ returns the DLQ actor's producer.
func NewDLQ(cfg DLQConfig) actor.Producer {
	return func() actor.Actor { return &DLQ{cfg: cfg} }
}

// Receive implements actor.Actor.
func (d *DLQ) Receive(c actor.Context) {
	switch msg := c.Message().(type) {
	case *actor.Started:
		d.pending = map[*deadLetterRequest]*dlqPending{}
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
		if d.stopped {
			c.Respond(&deadLetterFailed{err: ErrDLQStopped})
			return
		}
		p := &dlqPending{key: msg, sender: c.Sender(), letters: msg.letters, remaining: len(msg.letters)}
		if p.remaining == 0 {
			c.Respond(&deadLettered{})
			return
		}
		d.pending[msg] = p
		for i := range p.letters {
			p.letters[i].DLQTopic = d.cfg.Topic(p.letters[i].Record.Topic)
			d.produce(c, &dlqItem{req: p, idx: i})
		}
	case *cancelDeadLetter:
		if p, ok := d.pending[msg.req]; ok {
			d.fail(c, p, errors.New("dead-letter request cancelled"))
		}
	case *delivered:
		item, ok := msg.msg.Opaque.(*dlqItem)
		if !ok || item.req.done {
			return
		}
		if err := msg.msg.TopicPartition.Error; err != nil {
			d.retryLater(c, item, err)
			return
		}
		item.req.remaining--
		if item.req.remaining == 0 {
			item.req.done = true
			delete(d.pending, item.req.key)
			d.answer(c, item.req, &deadLettered{letters: item.req.letters})
		}
	case *reproduce:
		if !d.stopped && !msg.item.req.done {
			d.produce(c, msg.item)
		}
	case *actor.Restarting:
		// The new instance starts with no requests: fail this one's, their
		// callers ask again.
		d.failAll(c)
	case *actor.Stopping:
		d.stopped = true
		// Whatever is still queued gets what is left of the shutdown; a
		// partition waiting on it never committed past it, so nothing is
		// lost either way.
		d.cfg.Producer.Flush(int(d.flushTimeout() / time.Millisecond))
		d.cfg.Producer.Close()
		<-d.events
		// Delivery reports of the flush are queued behind this message and
		// never handled: whatever was not answered yet is failed.
		d.failAll(c)
	}
}

// flushTimeout is what the flush on stop may take.
func (d *DLQ) flushTimeout() time.Duration {
	if d.cfg.FlushBy != nil {
		if by := d.cfg.FlushBy(); !by.IsZero() {
			return max(time.Until(by), 0)
		}
	}
	return defaultFlush
}

// fail answers p with err and forgets it.
func (d *DLQ) fail(c actor.Context, p *dlqPending, err error) {
	p.done = true
	delete(d.pending, p.key)
	d.answer(c, p, &deadLetterFailed{err: err})
}

// failAll answers every request still held with ErrDLQStopped.
func (d *DLQ) failAll(c actor.Context) {
	for _, p := range d.pending {
		d.fail(c, p, ErrDLQStopped)
	}
}

// answer replies to p's sender (a request sent without one, by
// RootContext.Request, has nobody to answer).
func (d *DLQ) answer(c actor.Context, p *dlqPending, reply any) {
	if p.sender != nil {
		c.Send(p.sender, reply)
	}
}

func (d *DLQ) produce(c actor.Context, item *dlqItem) {
	l := item.req.letters[item.idx]
	item.attempts++
	topic := l.DLQTopic
	r := l.Record
	headers := l.Trace.Inject(letterHeaders(&l))
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

// DeadLetterHeaders are the headers the DLQ actor gives l's dead letter:
// for a dead letter written by another path (`ratchet pipelines
// backfill`) that must read as the engine's. decoding says the decoder
// refused the record.
func DeadLetterHeaders(l Letter, decoding bool) []kafka.Header {
	l.decoding = decoding
	return letterHeaders(&l)
}

// letterHeaders are the headers of l's dead letter: the original headers
// first, then ratchet's (with the original timestamp, `ratchet dlq replay`
// re-produces the record as it was).
func letterHeaders(l *Letter) []kafka.Header {
	r := l.Record
	headers := make([]kafka.Header, 0, len(r.Headers)+9)
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
	// The full text stays in ratchet.error; these say the same in fields
	// a person can group by.
	reason := reasonOf(l)
	headers = append(headers, kafka.Header{Key: HeaderReason, Value: []byte(reason.Class)})
	if reason.Pipeline != "" {
		headers = append(headers, kafka.Header{Key: HeaderPipeline, Value: []byte(reason.Pipeline)})
	}
	if reason.SQLState != "" {
		headers = append(headers, kafka.Header{Key: HeaderSQLState, Value: []byte(reason.SQLState)})
	}
	return headers
}

func (d *DLQ) retryLater(c actor.Context, item *dlqItem, err error) {
	l := item.req.letters[item.idx]
	wait := d.cfg.Backoff.Backoff(min(item.attempts, 20))
	d.cfg.Logger.Warn("dead-letter write failed; retrying", batchFields(l.Record.Topic, l.Record.Partition, l.batchStart,
		"actor", "dlq", "offset", l.Record.Offset, "dlq_topic", l.DLQTopic,
		"attempt", item.attempts, "wait", wait.String(), "err", err)...)
	self, root := c.Self(), c.ActorSystem().Root
	time.AfterFunc(wait, func() { root.Send(self, &reproduce{item: item}) })
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
