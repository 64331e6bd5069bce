package crash

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"ratchet/internal/produce"
	"ratchet/internal/testenv"
)

// TestSIGTERMDuringRebalanceExitsInTimeAndReplaysNothing runs real
// `ratchet run` processes in one at-least-once group while events flow, and
// sends SIGTERM to one moments after another has joined, so that the stop
// lands while the group rebalances. Every process must exit 0 within
// shutdown.timeout, measured from the signal to the exit (Close included),
// and the dashboard must count every event exactly once: in at-least-once
// mode a stop that left applied offsets uncommitted would count them again.
func TestSIGTERMDuringRebalanceExitsInTimeAndReplaysNothing(t *testing.T) {
	const (
		events   = 45_000
		stops    = 8
		shutdown = 10 * time.Second
	)
	_, addr := testenv.Kafka(t, 8, topic, topic+".dlq")
	dbURL := testenv.Postgres(t)
	bin := buildBinary(t)
	env := []string{
		"RATCHET_KAFKA_BROKERS=" + addr, "RATCHET_POSTGRES_URL=" + dbURL, "RATCHET_COMMIT_MODE=at-least-once",
		"RATCHET_HTTP_ADDR=", "RATCHET_SHUTDOWN_TIMEOUT=" + shutdown.String(), "RATCHET_COMMIT_INTERVAL=500ms",
		"RATCHET_POSTGRES_MAX_CONNS=6", // four processes beside other test packages: stay well inside 100 connections
	}
	opts := produce.Options{Seed: 7, Format: "protobuf", TimeSpread: 30 * time.Minute,
		Now: func() time.Time { return time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC) }}
	var produced sync.WaitGroup
	produced.Go(func() { producePaced(t, addr, opts, events, 3000) })

	var (
		stopped sync.WaitGroup
		insts   []*instance
	)
	for i := range 3 {
		insts = append(insts, startInstance(t, bin, fmt.Sprintf("s%d", i), env))
	}
	rng := rand.New(rand.NewPCG(3, 4))
	time.Sleep(3 * time.Second) // the group forms and consumes before the first change
	for k := range stops {
		insts = append(insts, startInstance(t, bin, fmt.Sprintf("s-join-%d", k), env))
		time.Sleep(time.Duration(200+rng.IntN(1300)) * time.Millisecond) // the SIGTERM lands in the join's rebalance
		i := rng.IntN(len(insts) - 1)
		in := insts[i]
		insts = append(insts[:i], insts[i+1:]...)
		stopped.Go(func() { termWithin(t, in, shutdown) })
	}
	produced.Wait()
	_, total := counted(t, dbURL)
	testenv.Eventually(t, 180*time.Second, func() bool { return total() >= events },
		"all %d events counted (have %d)", events, total())
	for _, in := range insts {
		stopped.Go(func() { termWithin(t, in, shutdown) })
	}
	stopped.Wait()
	if n := total(); n != events {
		t.Errorf("counted %d events, produced %d: %d replayed", n, events, n-events)
	}
}

// TestSIGTERMDuringRevokeBlockedOnARowLockExitsInTime stops a real
// `ratchet run` process while it serves a revoke whose drain waits on a
// PostgreSQL row lock: another connection holds every dashboard rollup row
// FOR UPDATE, so the batches in flight cannot finish. The stop is counted
// from the signal, not from the moment the revoke callback returns: the
// process must exit 0 within shutdown.timeout + 1 s of the SIGTERM. Once
// the lock is gone, the other members count every event exactly once.
func TestSIGTERMDuringRevokeBlockedOnARowLockExitsInTime(t *testing.T) {
	const (
		first, second = 2000, 2000
		shutdown      = 10 * time.Second
	)
	_, addr := testenv.Kafka(t, 4, topic, topic+".dlq")
	dbURL := testenv.Postgres(t)
	bin := buildBinary(t)
	env := []string{
		"RATCHET_KAFKA_BROKERS=" + addr, "RATCHET_POSTGRES_URL=" + dbURL, "RATCHET_COMMIT_MODE=exactly-once",
		"RATCHET_HTTP_ADDR=", "RATCHET_SHUTDOWN_TIMEOUT=" + shutdown.String(), "RATCHET_COMMIT_INTERVAL=500ms",
		"RATCHET_POSTGRES_MAX_CONNS=6", "RATCHET_LOG_LEVEL=info",
	}
	opts := produce.Options{Seed: 11, Format: "protobuf", TimeSpread: 5 * time.Minute,
		Now: func() time.Time { return time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC) }}
	produceAll(t, addr, opts, first)
	a := startInstance(t, bin, "a", env)
	pool, total := counted(t, dbURL)
	testenv.Eventually(t, 120*time.Second, func() bool { return total() >= first },
		"first %d events counted (have %d)", first, total())

	// Every rollup row the next events update is locked.
	ctx := context.Background()
	lock, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close(ctx)
	tx, err := lock.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM dashboard_rollups FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	o := opts
	o.Seed++
	produceAll(t, addr, o, second)
	waiting := func() int {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return n
	}
	testenv.Eventually(t, 60*time.Second, func() bool { return waiting() > 0 },
		"a batch of the first instance waits on the row lock")

	// A second member joins: the first one revokes half of its partitions,
	// and their drain waits on the lock.
	b := startInstance(t, bin, "b", env)
	revoking := func() bool {
		log, _ := os.ReadFile(filepath.Join(logDir(t), "a.log"))
		return strings.Contains(string(log), "partitions revoked: draining and committing")
	}
	testenv.Eventually(t, 60*time.Second, revoking, "the first instance revokes partitions")
	// The drain is under way (it would go on for the whole drain timeout).
	time.Sleep(time.Second) // the moment of the fault: well inside the revoke, nothing to wait for
	if waiting() == 0 {
		t.Fatal("no batch waits on the row lock any more: the scenario did not hold")
	}
	termWithin(t, a, shutdown+time.Second)

	// The lock goes; a restarted first member and the second count every
	// event once.
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	c := startInstance(t, bin, "a-again", env)
	testenv.Eventually(t, 120*time.Second, func() bool { return total() >= first+second },
		"all %d events counted (have %d)", first+second, total())
	termWithin(t, b, shutdown)
	termWithin(t, c, shutdown)
	if n := total(); n != first+second {
		t.Errorf("counted %d events, produced %d", n, first+second)
	}
}

// termWithin sends SIGTERM and requires exit code 0 within limit.
func termWithin(tb testing.TB, in *instance, limit time.Duration) {
	began := time.Now()
	_ = in.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-in.done:
		took := time.Since(began)
		var exit *exec.ExitError
		if errors.As(err, &exit) || err != nil {
			tb.Errorf("%s exited with %v after SIGTERM", in.name, err)
		}
		if took > limit {
			tb.Errorf("%s took %s from SIGTERM to exit, the limit is %s", in.name, took.Round(time.Millisecond), limit)
		}
		tb.Logf("%s exited %s after SIGTERM", in.name, took.Round(time.Millisecond))
	case <-time.After(limit + 5*time.Second):
		tb.Errorf("%s did not exit within %s of SIGTERM", in.name, limit+5*time.Second)
		in.kill()
	}
}

// producePaced writes n of the generator's events at about perSecond.
func producePaced(tb testing.TB, addr string, opts produce.Options, n, perSecond int) {
	const chunk = 500
	for sent := 0; sent < n; sent += chunk {
		began := time.Now()
		o := opts
		o.Seed = opts.Seed + int64(sent) // a distinct stream per chunk; ids stay unique
		produceAll(tb, addr, o, min(chunk, n-sent))
		time.Sleep(time.Duration(chunk)*time.Second/time.Duration(perSecond) - time.Since(began)) // pacing
	}
}
