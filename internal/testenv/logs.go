package testenv

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// LogLine is one record a LogRecorder received: its level, message and
// attributes, those of the logger (With) included, groups flattened into
// dotted keys ("offsets.3").
type LogLine struct {
	Level slog.Level
	Msg   string
	Attrs map[string]any
}

// LogRecorder is a slog.Handler that keeps every record it receives, for
// tests that assert what was logged. Safe for concurrent use. Its zero
// value is not usable: call NewLogRecorder.
type LogRecorder struct {
	level slog.Level
	rec   *logRecords
	attrs []slog.Attr
	group string
}

type logRecords struct {
	mu    sync.Mutex
	lines []LogLine
}

// NewLogRecorder returns a recorder that keeps the records at level and
// above.
func NewLogRecorder(level slog.Level) *LogRecorder {
	return &LogRecorder{level: level, rec: &logRecords{}}
}

// Logger returns a logger writing to r.
func (r *LogRecorder) Logger() *slog.Logger { return slog.New(r) }

// Enabled implements slog.Handler.
func (r *LogRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= r.level }

// Handle implements slog.Handler.
func (r *LogRecorder) Handle(_ context.Context, rec slog.Record) error {
	line := LogLine{Level: rec.Level, Msg: rec.Message, Attrs: map[string]any{}}
	for _, a := range r.attrs {
		flatten(line.Attrs, "", a)
	}
	rec.Attrs(func(a slog.Attr) bool {
		flatten(line.Attrs, r.group, a)
		return true
	})
	r.rec.mu.Lock()
	defer r.rec.mu.Unlock()
	r.rec.lines = append(r.rec.lines, line)
	return nil
}

func flatten(into map[string]any, prefix string, a slog.Attr) {
	v := a.Value.Resolve()
	key := a.Key
	if prefix != "" {
		key = prefix + "." + key
	}
	if v.Kind() == slog.KindGroup {
		for _, g := range v.Group() {
			flatten(into, key, g)
		}
		return
	}
	into[key] = v.Any()
}

// WithAttrs implements slog.Handler.
func (r *LogRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	c := *r
	c.attrs = slices.Clone(r.attrs)
	for _, a := range as {
		if r.group != "" {
			a = slog.Attr{Key: r.group + "." + a.Key, Value: a.Value}
		}
		c.attrs = append(c.attrs, a)
	}
	return &c
}

// WithGroup implements slog.Handler.
func (r *LogRecorder) WithGroup(name string) slog.Handler {
	c := *r
	if c.group != "" {
		name = c.group + "." + name
	}
	c.group = name
	return &c
}

// Lines returns the records kept so far whose message is msg; every
// record when msg is empty.
func (r *LogRecorder) Lines(msg string) []LogLine {
	r.rec.mu.Lock()
	defer r.rec.mu.Unlock()
	var out []LogLine
	for _, l := range r.rec.lines {
		if msg == "" || l.Msg == msg {
			out = append(out, l)
		}
	}
	return out
}

// FakeClock is a clock a test moves by hand (Advance). It has Now and
// After like the time package, so it serves interfaces such as
// actors.Clock. Safe for concurrent use.
type FakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []fakeWaiter
}

type fakeWaiter struct {
	at time.Time
	ch chan time.Time
}

// NewFakeClock returns a clock that reads start until it is advanced.
func NewFakeClock(start time.Time) *FakeClock { return &FakeClock{now: start} }

// Now returns the clock's time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After returns a channel that receives the clock's time once it has been
// advanced by d or more.
func (c *FakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, fakeWaiter{at: c.now.Add(d), ch: ch})
	return ch
}

// Waiters returns how many After channels have not fired yet: a test
// waits for a goroutine to be waiting before it advances the clock.
func (c *FakeClock) Waiters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters)
}

// Advance moves the clock by d and fires every After that is due.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if w.at.After(c.now) {
			kept = append(kept, w)
			continue
		}
		w.ch <- c.now
	}
	c.waiters = kept
}
