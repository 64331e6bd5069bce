package testenv_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"ratchet/internal/testenv"
)

// recorder is a testing.TB that records failures instead of failing, for
// the paths of the harness that must not stop the test goroutine.
type recorder struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recorder) Helper() {}

func (r *recorder) Cleanup(func()) {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recorder) failures() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.errs...)
}

// untilCancelled is a RunFunc that listens, logs, and returns err once ctx
// is cancelled.
func untilCancelled(err error) testenv.RunFunc {
	return func(ctx context.Context, log *slog.Logger, onListening func(string)) error {
		log.Info("engine starting", "owner", "t")
		onListening("127.0.0.1:1234")
		<-ctx.Done()
		return err
	}
}

func TestEngineStop(t *testing.T) {
	for _, c := range []struct {
		name    string
		err     error
		wantErr bool
	}{
		{"clean stop", nil, false},
		{"stop with an error", errors.New("boom"), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := &recorder{TB: t}
			logs := &testenv.Buffer{}
			e := testenv.StartEngine(rec, testenv.EngineOptions{Log: testenv.Log{To: logs, JSON: true}}, untilCancelled(c.err))
			if addr := e.Addr(t, 5*time.Second); addr != "127.0.0.1:1234" {
				t.Errorf("Addr = %q", addr)
			}
			e.Stop(rec)
			e.Stop(rec) // a second stop does nothing
			if got := len(rec.failures()) > 0; got != c.wantErr {
				t.Errorf("failures %v, want a failure: %v", rec.failures(), c.wantErr)
			}
			if !strings.Contains(logs.String(), `"msg":"engine starting"`) {
				t.Errorf("the log did not reach the buffer as JSON: %q", logs.String())
			}
		})
	}
}

// TestEngineWaitCollects: a test that takes the engine's result with Wait
// owns it; the stop at the end of the test checks nothing more.
func TestEngineWaitCollects(t *testing.T) {
	rec := &recorder{TB: t}
	want := errors.New("fenced")
	e := testenv.StartEngine(rec, testenv.EngineOptions{}, func(context.Context, *slog.Logger, func(string)) error {
		return want
	})
	select {
	case <-e.Exited():
	case <-time.After(5 * time.Second):
		t.Fatal("Exited was not closed")
	}
	if err := e.Wait(t, 0); !errors.Is(err, want) { // exited: no wait
		t.Errorf("Wait = %v, want %v", err, want)
	}
	e.Stop(rec)
	if f := rec.failures(); len(f) > 0 {
		t.Errorf("Stop after Wait reported %v", f)
	}
}

// TestEngineCancelThenStop: Cancel starts the stop without waiting, and
// Stop then waits for it and checks the result.
func TestEngineCancelThenStop(t *testing.T) {
	rec := &recorder{TB: t}
	e := testenv.StartEngine(rec, testenv.EngineOptions{}, untilCancelled(nil))
	e.Cancel()
	select {
	case <-e.Exited():
	case <-time.After(5 * time.Second):
		t.Fatal("Cancel did not stop the engine")
	}
	e.Stop(rec)
	if f := rec.failures(); len(f) > 0 {
		t.Errorf("Stop after Cancel reported %v", f)
	}
}
