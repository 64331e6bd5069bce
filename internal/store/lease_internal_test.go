package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestReplayLeaseDeadline drives a lease's renewals with a fake clock
// (synctest) and renewals that fail, hang, answer late or find the lease
// taken: the holder gives the lease up by its own clock, ttl-margin after
// it SENT the last renewal that succeeded, never later, and a slow answer
// does not move its deadline past what the database granted.
func TestReplayLeaseDeadline(t *testing.T) {
	const ttl = 30 * time.Second
	margin := replayLeaseMargin(ttl)
	errCut := errors.New("connection refused")
	cases := []struct {
		name string
		// extend is renewal number n (from 1), started at elapsed since
		// the claim was sent.
		extend func(ctx context.Context, n int, elapsed time.Duration) (bool, error)
		// lostAt is when Lost must close, since the claim was sent; 0:
		// never within 10 ttl.
		lostAt time.Duration
		reason string
	}{
		{"renewals succeed", func(context.Context, int, time.Duration) (bool, error) { return true, nil }, 0, ""},
		{"every renewal fails", func(context.Context, int, time.Duration) (bool, error) { return false, errCut },
			ttl - margin, "connection refused"},
		{"renewals hang", func(ctx context.Context, _ int, _ time.Duration) (bool, error) {
			<-ctx.Done() // the renewal is bounded by the holder's deadline
			return false, ctx.Err()
		}, ttl - margin, "deadline exceeded"},
		{"renewals fail after the first", func(_ context.Context, n int, _ time.Duration) (bool, error) {
			if n == 1 {
				return true, nil
			}
			return false, errCut
		}, ttl/3 + ttl - margin, "connection refused"},
		{"a late answer counts from when it was sent", func(_ context.Context, n int, _ time.Duration) (bool, error) {
			if n == 1 {
				time.Sleep(ttl / 3) // the answer's latency, on the fake clock
				return true, nil
			}
			return false, errCut
		}, ttl/3 + ttl - margin, "connection refused"},
		{"taken by another run", func(context.Context, int, time.Duration) (bool, error) { return false, nil },
			ttl / 3, "taken by another run"},
		{"taken after failures", func(_ context.Context, n int, _ time.Duration) (bool, error) {
			if n < 3 {
				return false, errCut
			}
			return false, nil
		}, ttl/3 + 2*(ttl/15), "taken by another run"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				n := 0
				l := newReplayLease("events.dlq", "a", ttl, start, func(ctx context.Context) (bool, error) {
					n++
					return tc.extend(ctx, n, time.Since(start))
				})
				ctx, stop := context.WithCancel(t.Context())
				l.stop = stop
				go l.renew(ctx)
				if got := l.Deadline().Sub(start); got != ttl-margin {
					t.Fatalf("deadline after the claim: %v, want %v", got, ttl-margin)
				}
				var lostAt time.Duration
				select {
				case <-l.Lost():
					lostAt = time.Since(start)
				case <-time.After(10 * ttl):
				}
				stop()
				<-l.renewing
				if lostAt != tc.lostAt {
					t.Fatalf("lost at %v after the claim, want %v (0: never); err %v", lostAt, tc.lostAt, l.Err())
				}
				if tc.lostAt == 0 {
					if l.Err() != nil {
						t.Fatalf("held lease has Err %v", l.Err())
					}
					return
				}
				if err := l.Err(); !errors.Is(err, ErrReplayLeaseLost) || !strings.Contains(err.Error(), tc.reason) {
					t.Fatalf("Err() = %v, want ErrReplayLeaseLost saying %q", err, tc.reason)
				}
			})
		})
	}
}
