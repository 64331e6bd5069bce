package testenv

import (
	"cmp"
	"context"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"
)

// Log says where an engine started by a test logs. With RATCHET_TEST_LOG
// set it also logs to stderr, at debug level.
type Log struct {
	// To collects the log for assertions; nil discards it.
	To *Buffer
	// JSON writes JSON lines (to assert on keys and values) instead of
	// text.
	JSON bool
	// Level is the lowest level written (the zero value is Info).
	Level slog.Level
}

// Logger returns the logger l describes.
func (l Log) Logger() *slog.Logger {
	var w io.Writer = io.Discard
	if l.To != nil {
		w = l.To
	}
	level := l.Level
	if os.Getenv("RATCHET_TEST_LOG") != "" {
		level = slog.LevelDebug
		if l.To != nil {
			w = io.MultiWriter(l.To, os.Stderr)
		} else {
			w = os.Stderr
		}
	}
	opts := &slog.HandlerOptions{Level: level}
	if l.JSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// RunFunc is what StartEngine runs: in practice engine.Run with the test's
// configuration and options, log as Options.Logger and onListening as
// Options.OnListening. It must return once ctx is cancelled.
//
// testenv takes a function rather than calling engine.Run itself because
// it cannot import package engine: the in-package tests of actors and
// internal/schemareg import testenv, and engine imports both.
type RunFunc func(ctx context.Context, log *slog.Logger, onListening func(addr string)) error

// EngineOptions configures StartEngine.
type EngineOptions struct {
	Log Log
	// StopWithin bounds Stop's wait for the engine to return (zero: 60s).
	StopWithin time.Duration
}

// Engine is one engine run by a test, from StartEngine until it returns.
type Engine struct {
	stopWithin time.Duration
	cancel     context.CancelFunc
	exited     chan struct{} // closed when run returned
	err        error         // run's result, once exited is closed
	addrs      chan string   // the HTTP address, once it listens

	mu        sync.Mutex
	collected bool // a caller took run's result: Stop has nothing to check
}

// StartEngine calls run on a goroutine of its own, which ends when run
// returns: after Stop or Cancel, or by itself (a fatal error). The engine
// is stopped when the test ends, and an error it returns then fails the
// test, unless the test collected the result with Wait.
func StartEngine(tb testing.TB, o EngineOptions, run RunFunc) *Engine {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e := &Engine{
		stopWithin: cmp.Or(o.StopWithin, 60*time.Second),
		cancel:     cancel,
		exited:     make(chan struct{}),
		addrs:      make(chan string, 1),
	}
	log := o.Log.Logger()
	go func() { // ends when run returns, which it does once ctx is cancelled
		defer close(e.exited)
		e.err = run(ctx, log, func(addr string) {
			select {
			case e.addrs <- addr:
			default: // a second server start (none today) is not waited for
			}
		})
	}()
	tb.Cleanup(func() { e.Stop(tb) })
	return e
}

// Cancel tells the engine to stop and returns at once; Stop or Wait then
// wait for it.
func (e *Engine) Cancel() { e.cancel() }

// Exited is closed when the engine has returned.
func (e *Engine) Exited() <-chan struct{} { return e.exited }

// Listening delivers the engine's HTTP address once it listens.
func (e *Engine) Listening() <-chan string { return e.addrs }

// Addr waits until the engine's HTTP server listens and returns its
// address. It fails the test when the engine returns first or nothing
// listens within the timeout.
func (e *Engine) Addr(tb testing.TB, within time.Duration) string {
	tb.Helper()
	select {
	case addr := <-e.addrs:
		return addr
	case <-e.exited:
		e.collect()
		tb.Fatalf("engine stopped before listening: %v", e.err)
	case <-time.After(within):
		tb.Fatalf("engine did not listen within %s", within)
	}
	return ""
}

// Wait waits until the engine returns, without stopping it, and returns
// its error: the test takes the result over, and Stop no longer checks it.
// It fails the test when the engine does not return within the timeout.
// After Exited is closed, Wait(tb, 0) returns the error at once.
func (e *Engine) Wait(tb testing.TB, within time.Duration) error {
	tb.Helper()
	t := time.NewTimer(within)
	defer t.Stop()
	select {
	case <-e.exited:
	default:
		select {
		case <-e.exited:
		case <-t.C:
			tb.Fatalf("engine did not return within %s", within)
			return nil
		}
	}
	e.collect()
	return e.err
}

// Stop stops the engine gracefully and waits for it: the test fails when
// it returns an error or does not return within EngineOptions.StopWithin.
// It does nothing when the test already collected the result (Wait), or
// on a second call.
func (e *Engine) Stop(tb testing.TB) {
	tb.Helper()
	if e.collect() {
		return
	}
	e.cancel()
	select {
	case <-e.exited:
		if e.err != nil {
			tb.Errorf("engine stopped with error: %v", e.err)
		}
	case <-time.After(e.stopWithin):
		tb.Fatalf("engine did not stop within %s", e.stopWithin)
	}
}

// collect marks the result as taken and reports whether it already was.
func (e *Engine) collect() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	was := e.collected
	e.collected = true
	return was
}
