package cli

import (
	"context"
	"fmt"
	"io"
	"runtime/pprof"
	"time"
)

// backstopGrace is how far past shutdown.timeout a stop may run before
// the process ends itself.
const backstopGrace = time.Second

// stopBackstop ends the process when a stop outlives its deadline: once
// ctx is done (the signal), it waits timeout + backstopGrace for done
// (the command returned), and otherwise writes why, and every goroutine's
// stack (what the stop waits on), to stderr and calls exit(ExitError).
// Every wait of a stop is bounded by shutdown.timeout counted from the
// signal; this is the promise's last line, for a wait that is not (a
// librdkafka call that never returns, a bug), and its stacks say which.
// Exactly-once holds after such an exit as after a second signal. It
// returns when done is closed or after exit; a Main process only: a test
// process must not exit under its tests.
func stopBackstop(ctx context.Context, timeout time.Duration, done <-chan struct{}, stderr io.Writer, exit func(int)) {
	select {
	case <-done:
		return
	case <-ctx.Done():
	}
	t := time.NewTimer(timeout + backstopGrace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		fmt.Fprintf(stderr, "ratchet: the stop did not end within shutdown.timeout (%s) of the signal; exiting now. What it waited on:\n", timeout)
		_ = pprof.Lookup("goroutine").WriteTo(stderr, 2)
		exit(ExitError)
	}
}
