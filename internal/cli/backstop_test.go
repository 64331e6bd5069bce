package cli

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestStopBackstop: a stop that outlives shutdown.timeout (counted from the
// signal) ends the process with exit code 1 and the stacks of what it waited
// on; a stop that ends in time, or a run never signalled, exits nothing.
func TestStopBackstop(t *testing.T) {
	const timeout = 200 * time.Millisecond
	type result struct {
		code   int
		at     time.Duration
		stderr string
	}
	run := func(t *testing.T, returnAfter time.Duration, signal bool) (result, bool) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan struct{})
		exited := make(chan int, 1)
		var mu sync.Mutex
		var stderr bytes.Buffer
		w := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return stderr.Write(p) })
		finished := make(chan struct{})
		go func() { stopBackstop(ctx, timeout, done, w, func(code int) { exited <- code }); close(finished) }()
		start := time.Now()
		if signal {
			cancel()
		}
		returned := time.AfterFunc(returnAfter, func() { close(done) })
		defer returned.Stop()
		select {
		case code := <-exited:
			<-finished
			mu.Lock()
			defer mu.Unlock()
			return result{code: code, at: time.Since(start), stderr: stderr.String()}, true
		case <-finished:
			return result{}, false
		case <-time.After(10 * time.Second):
			t.Fatal("the backstop neither exited nor returned")
		}
		return result{}, false
	}
	t.Run("a stop that hangs", func(t *testing.T) {
		r, exited := run(t, time.Hour, true)
		if !exited {
			t.Fatal("the backstop returned without exiting")
		}
		if r.code != ExitError {
			t.Errorf("exit code %d, want %d", r.code, ExitError)
		}
		if r.at < timeout || r.at > timeout+backstopGrace+2*time.Second {
			t.Errorf("exited %s after the signal, want shutdown.timeout %s + %s", r.at, timeout, backstopGrace)
		}
		if !strings.Contains(r.stderr, "did not end within shutdown.timeout") || !strings.Contains(r.stderr, "goroutine ") {
			t.Errorf("stderr says neither why nor what it waited on:\n%.400s", r.stderr)
		}
	})
	t.Run("a stop in time", func(t *testing.T) {
		if _, exited := run(t, timeout/4, true); exited {
			t.Fatal("exited although the stop ended in time")
		}
	})
	t.Run("no signal", func(t *testing.T) {
		if _, exited := run(t, 2*timeout+backstopGrace, false); exited {
			t.Fatal("exited without a signal")
		}
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
