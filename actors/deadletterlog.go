package actors

// The log lines about dead letters. At 1 % poison of 10,000 records a
// second a line per dead letter is 100 WARN lines a second, and they bury
// the lines that need a person. DeadLetterLog writes the first dead letter
// of a (topic, reason class) in full and then counts: one summary line per
// class at most every interval, with the count and the offsets' range per
// partition. Every detail stays where it was: the DLQ record (its
// ratchet.* headers), the ratchet_dead_letters rows and the metrics.

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"ratchet/internal/event"
	"ratchet/internal/redact"
	"ratchet/processor"
)

// Dead-letter log modes (log.dead_letters).
const (
	// DeadLetterLogEach writes a WARN line per dead letter.
	DeadLetterLogEach = "each"
	// DeadLetterLogSummary writes the first dead letter of a topic and
	// reason class in full, then a summary line per class at most every
	// interval.
	DeadLetterLogSummary = "summary"
	// DeadLetterLogOff writes no line about dead letters.
	DeadLetterLogOff = "off"
)

// Clock tells DeadLetterLog the time. SystemClock is the real one; tests
// pass one they move by hand.
type Clock interface {
	Now() time.Time
	// After is time.After.
	After(d time.Duration) <-chan time.Time
}

// SystemClock is the Clock of the time package.
type SystemClock struct{}

// Now implements Clock.
func (SystemClock) Now() time.Time { return time.Now() }

// After implements Clock.
func (SystemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// DeadLetterLogConfig configures a DeadLetterLog.
type DeadLetterLogConfig struct {
	Mode     string        // DeadLetterLogEach, DeadLetterLogSummary or DeadLetterLogOff
	Interval time.Duration // least time between two summary lines of one class
	Logger   *slog.Logger
	Clock    Clock // nil: SystemClock
	// IncludeValues writes the errors as they are (log.include_values);
	// otherwise the record values they quote are replaced (redact.Values).
	IncludeValues bool
}

// DeadLetterLog writes the log lines about dead letters for the whole
// instance: every partition's letters of one (topic, reason class) share a
// summary. Safe for concurrent use: the partitions' and retry actors'
// dead-letter writes call Record from their own goroutines.
//
// In summary mode a letter is written in full when nothing was written
// about its class within the last interval; otherwise it is counted, and
// the count goes out as one "dead letters" line once the interval since
// the class's last line has passed (Record and Run check). Close writes
// what is still counted, so no count is missing from the log; a letter
// recorded after Close is written in full.
type DeadLetterLog struct {
	cfg DeadLetterLogConfig

	mu      sync.Mutex
	classes map[deadLetterClassKey]*deadLetterClass
	closed  bool
}

type deadLetterClassKey struct {
	topic string
	Reason
}

// deadLetterClass is the state of one (topic, reason class).
type deadLetterClass struct {
	lastLine time.Time // when a line about the class was last written
	// Counted since lastLine and not written yet.
	count int
	since time.Time // when the first of them was counted
	parts map[int32]*offsetSpan
}

// offsetSpan is the lowest and highest offset counted on one partition.
type offsetSpan struct{ first, last int64 }

// maxSummaryPartitions bounds the partitions a summary line lists; the
// rest are counted in more_partitions.
const maxSummaryPartitions = 16

// NewDeadLetterLog returns a DeadLetterLog. An unknown mode is taken as
// DeadLetterLogEach (config validation refuses it before this).
func NewDeadLetterLog(cfg DeadLetterLogConfig) *DeadLetterLog {
	if cfg.Clock == nil {
		cfg.Clock = SystemClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &DeadLetterLog{cfg: cfg, classes: map[deadLetterClassKey]*deadLetterClass{}}
}

// Record logs letters, which are being written to the dead-letter topic,
// as the mode says. A nil *DeadLetterLog writes each letter to fallback.
func (l *DeadLetterLog) Record(fallback *slog.Logger, letters []Letter) {
	if l == nil {
		for i := range letters {
			logDeadLetter(fallback, &letters[i], false)
		}
		return
	}
	switch l.cfg.Mode {
	case DeadLetterLogOff:
		return
	case DeadLetterLogSummary:
	default:
		for i := range letters {
			logDeadLetter(l.cfg.Logger, &letters[i], l.cfg.IncludeValues)
		}
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.cfg.Clock.Now()
	for i := range letters {
		lt := &letters[i]
		if l.closed {
			logDeadLetter(l.cfg.Logger, lt, l.cfg.IncludeValues)
			continue
		}
		k := deadLetterClassKey{topic: lt.Record.Topic, Reason: reasonOf(lt)}
		c := l.classes[k]
		if c == nil {
			c = &deadLetterClass{}
			l.classes[k] = c
		}
		if c.count == 0 && (c.lastLine.IsZero() || now.Sub(c.lastLine) >= l.cfg.Interval) {
			logDeadLetter(l.cfg.Logger, lt, l.cfg.IncludeValues)
			c.lastLine = now
			continue
		}
		if c.count == 0 {
			c.since = now
			c.parts = map[int32]*offsetSpan{}
		}
		c.count++
		off := lt.Record.Offset
		if s := c.parts[lt.Record.Partition]; s == nil {
			c.parts[lt.Record.Partition] = &offsetSpan{first: off, last: off}
		} else {
			s.first, s.last = min(s.first, off), max(s.last, off)
		}
	}
	l.writeDue(now, false)
}

// Run writes the summaries that are due while no dead letter comes to
// trigger them, until ctx ends. The engine runs it for the engine's life.
// It looks every second, or every Interval when that is shorter; an
// Interval of zero or less (configuration refuses it, a caller of
// NewDeadLetterLog may not) still looks every second, never in a busy
// loop.
func (l *DeadLetterLog) Run(ctx context.Context) {
	period := min(l.cfg.Interval, time.Second)
	if period <= 0 {
		period = time.Second
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.cfg.Clock.After(period):
			l.mu.Lock()
			l.writeDue(l.cfg.Clock.Now(), false)
			l.mu.Unlock()
		}
	}
}

// Close writes every summary still counted, due or not, and makes later
// letters be written in full: the stop calls it once the partitions
// stopped, so the log holds every count. Calling it again writes nothing
// new.
func (l *DeadLetterLog) Close() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writeDue(l.cfg.Clock.Now(), true)
	l.closed = true
}

// writeDue writes the summary of every class whose interval has passed
// (all of them when all), in topic and reason order, and forgets classes
// quiet for a whole interval. Called with l.mu held.
func (l *DeadLetterLog) writeDue(now time.Time, all bool) {
	keys := slices.SortedFunc(maps.Keys(l.classes), func(a, b deadLetterClassKey) int {
		return cmp.Or(cmp.Compare(a.topic, b.topic), cmp.Compare(a.Pipeline, b.Pipeline),
			cmp.Compare(a.Class, b.Class), cmp.Compare(a.SQLState, b.SQLState))
	})
	for _, k := range keys {
		c := l.classes[k]
		due := now.Sub(c.lastLine) >= l.cfg.Interval
		if c.count > 0 && (due || all) {
			l.writeSummary(k, c, now)
			c.lastLine, c.count, c.parts = now, 0, nil
			continue
		}
		if c.count == 0 && due {
			delete(l.classes, k) // its next letter is written in full anyway
		}
	}
}

func (l *DeadLetterLog) writeSummary(k deadLetterClassKey, c *deadLetterClass, now time.Time) {
	parts := slices.Sorted(maps.Keys(c.parts))
	more := 0
	if len(parts) > maxSummaryPartitions {
		more = len(parts) - maxSummaryPartitions
		parts = parts[:maxSummaryPartitions]
	}
	offsets := make([]any, 0, len(parts))
	for _, p := range parts {
		s := c.parts[p]
		offsets = append(offsets, slog.String(strconv.Itoa(int(p)), strconv.FormatInt(s.first, 10)+".."+strconv.FormatInt(s.last, 10)))
	}
	args := append([]any{"actor", "dlq", "topic", k.topic}, k.Reason.logArgs()...)
	args = append(args, "count", c.count, "partitions", len(c.parts), slog.Group("offsets", offsets...))
	if more > 0 {
		args = append(args, "more_partitions", more)
	}
	args = append(args, "since", c.since.UTC().Format(time.RFC3339Nano),
		"window", now.Sub(c.since).Round(time.Millisecond).String())
	l.cfg.Logger.Warn("dead letters", args...)
}

// Text returns err's text as the log, the traces and the page may show
// it: without the record values it quotes unless IncludeValues (a nil
// *DeadLetterLog redacts).
func (l *DeadLetterLog) Text(err error) string {
	return reasonText(err, l != nil && l.cfg.IncludeValues)
}

func reasonText(err error, includeValues bool) string {
	if includeValues {
		return err.Error()
	}
	return redact.Values(err.Error())
}

// logDeadLetter writes one dead letter in full: where it came from, the
// batch it was cut or isolated from, the class and the error (its values
// replaced unless includeValues).
func logDeadLetter(log *slog.Logger, l *Letter, includeValues bool) {
	r := l.Record
	args := []any{"actor", "dlq", "offset", r.Offset, "attempts", l.Attempts}
	args = append(args, reasonOf(l).logArgs()...)
	args = append(args, "err", reasonText(l.Reason, includeValues), l.Trace.LogAttr())
	log.Warn("dead letter", batchFields(r.Topic, r.Partition, l.batchStart, args...)...)
}

// logArgs are r's fields in a log line: reason, and pipeline and sqlstate
// when there are.
func (r Reason) logArgs() []any {
	args := []any{"reason", r.Class}
	if r.Pipeline != "" {
		args = append(args, "pipeline", r.Pipeline)
	}
	if r.SQLState != "" {
		args = append(args, "sqlstate", r.SQLState)
	}
	return args
}

// Reason classes: why a record was dead-lettered, stable and few (the
// ratchet.reason header, the reason of the log lines, what `ratchet dlq
// ls`, the page and `ratchet pipelines check --sample` group by). Never
// the error text, which names offsets and values and would make every
// record a class of its own.
const (
	// ReasonDecode: the value did not decode (the topic's format, the
	// registry's framing, or a processor's own decoder).
	ReasonDecode = "decode"
	// ReasonInvalidEvent: decoded, but broke a rule of the event contract.
	ReasonInvalidEvent = "invalid_event"
	// ReasonExpression: a pipeline could not evaluate its expressions on
	// the record, or could not convert a result to its column.
	ReasonExpression = "expression"
	// ReasonRefusedByPostgres: PostgreSQL refused the record's rows (a
	// data exception or a constraint); the SQLSTATE says which.
	ReasonRefusedByPostgres = "refused_by_postgres"
	// ReasonProcessorPanic: the processor panicked on it at every attempt.
	ReasonProcessorPanic = "processor_panic"
	// ReasonProcessorRefused: the processor marked it processor.Permanent.
	ReasonProcessorRefused = "processor_refused"
	// ReasonRetriesExhausted: it kept failing for another reason until
	// retry.max_attempts.
	ReasonRetriesExhausted = "retries_exhausted"
)

// Reason is why a record was dead-lettered, in the fields a person
// groups by.
type Reason struct {
	// Class is one of the Reason* constants, or the class an error of the
	// chain names itself (ReasonClasser).
	Class string
	// Pipeline is the configured pipeline that refused the record (empty
	// when none did: a decode failure, a processor of the program's own).
	Pipeline string
	// SQLState is PostgreSQL's code when it refused the record.
	SQLState string
}

// ReasonClasser is implemented by an error that knows its reason class
// better than the chain's types say (a pipeline's conversion or time
// error, a cost limit): the first one in the chain wins over
// ReasonExpression and ReasonProcessorRefused.
type ReasonClasser interface {
	ReasonClass() string
}

// ClassifyReason returns the reason of a dead letter whose error is err;
// decoding says the partition's decoder refused the record when its batch
// was cut.
func ClassifyReason(err error, decoding bool) Reason {
	var r Reason
	var pl interface{ PipelineName() string }
	if errors.As(err, &pl) {
		r.Pipeline = pl.PipelineName()
	}
	var pe *PanicError
	var ee *event.Error
	var pg *pgconn.PgError
	var rc ReasonClasser
	switch {
	case errors.As(err, &pe):
		r.Class = ReasonProcessorPanic
	case errors.As(err, &ee):
		r.Class = ReasonInvalidEvent
		if ee.Kind == event.KindDecode {
			r.Class = ReasonDecode
		}
	case decoding:
		r.Class = ReasonDecode
	case errors.As(err, &pg):
		r.Class, r.SQLState = ReasonRefusedByPostgres, pg.Code
	case errors.As(err, &rc) && rc.ReasonClass() != "":
		r.Class = rc.ReasonClass()
	case r.Pipeline != "" && processor.IsPermanent(err):
		r.Class = ReasonExpression
	case processor.IsPermanent(err):
		r.Class = ReasonProcessorRefused
	default:
		r.Class = ReasonRetriesExhausted
	}
	return r
}

// reasonOf is the reason of l.
func reasonOf(l *Letter) Reason { return ClassifyReason(l.Reason, l.decoding) }
