package crash

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/internal/event"
	"ratchet/internal/produce"
	"ratchet/internal/testenv"
)

// TestBehindPgBouncer runs real ratchet processes and commands against a
// PgBouncer in transaction mode, with the plain URL a user would write (no
// default_query_exec_mode): a second member joins and leaves, a member is
// killed with -9 and restarted (its start migrates again, on server sessions
// the dead one used), the pooler is restarted under load, and
// `ratchet offsets`, `ratchet dlq ls` and `ratchet offsets reset --execute`
// run while the group works. Every event is counted exactly once (the reset
// replays a known number of records, counted once more), nothing is
// dead-lettered, every instance survives the pooler's restart, and no log
// line mentions a prepared statement.
func TestBehindPgBouncer(t *testing.T) {
	// Small enough for every make test; RATCHET_SOAK=1 runs more.
	first, second, shift := 20_000, 10_000, 50
	if os.Getenv("RATCHET_SOAK") != "" {
		first, second = 150_000, 50_000
	}
	// kfake, not the mock cluster: offsets reset lists consumer groups.
	_, addr := testenv.Kafka(t, 6, topic, topic+".dlq")
	dbURL := testenv.Postgres(t)
	pooler := testenv.StartPgBouncer(t, dbURL, testenv.PgBouncerOptions{PoolSize: 6})
	bin := buildBinary(t)
	env := []string{
		"RATCHET_KAFKA_BROKERS=" + addr, "RATCHET_POSTGRES_URL=" + pooler.URL(), "RATCHET_COMMIT_MODE=exactly-once",
		"RATCHET_HTTP_ADDR=", "RATCHET_KAFKA_PROPERTIES=session.timeout.ms=6000,heartbeat.interval.ms=500,max.poll.interval.ms=10000",
	}
	pool, total := counted(t, dbURL) // directly, not through the pooler
	dir := logDir(t)
	t.Cleanup(func() { assertNoPreparedStatements(t, dir, pooler) })

	opts := produce.Options{Seed: 7, Format: event.FormatProtobuf, TimeSpread: 30 * time.Minute,
		Now: func() time.Time { return time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC) }}
	var produced sync.WaitGroup
	produced.Go(func() { produceAll(t, addr, opts, first) })

	a := startInstance(t, bin, "a", env)
	testenv.Eventually(t, 60*time.Second, func() bool { return total() > 0 }, "the first instance counts through the pooler")
	b := startInstance(t, bin, "b", env) // joins: a rebalance
	progress := func(n int64) {
		t.Helper()
		testenv.Eventually(t, 120*time.Second, func() bool { return total() >= n },
			"%d events counted (have %d)", n, total())
	}
	progress(int64(first) / 4)
	a.kill()
	a = startInstance(t, bin, "a-restarted", env)
	progress(int64(first) / 2)
	pooler.Restart(t) // under load: every client connection is cut
	runCommand(t, bin, env, "offsets-during", "offsets")
	produced.Wait()
	progress(int64(first))
	b.term(t) // leaves: a rebalance
	select {
	case err := <-a.done: // the pooler's restart did not end it
		t.Fatalf("instance %s exited: %v", a.name, err)
	default:
	}
	if n := total(); n != int64(first) {
		t.Fatalf("counted %d events, produced %d", n, first)
	}

	// A reset while the group works: partition 0 goes back by shift
	// records, which its owner applies again at its next batch.
	// b's leaving moves partitions: an instance may claim partition 0
	// between the command's plan and its move, which the command then
	// leaves as it is and says so ("run the command again"), as it would
	// to an operator.
	for attempt := 1; ; attempt++ {
		out, err := tryCommand(t, bin, env, fmt.Sprintf("offsets-reset-%d", attempt), "offsets", "reset", "--shift-by", fmt.Sprint(-shift),
			"--partitions", "0", "--execute")
		if err == nil {
			break
		}
		if attempt == 5 || !strings.Contains(out, "claimed by an instance since the plan") {
			t.Fatalf("ratchet offsets reset (attempt %d): %v\n%s", attempt, err, out)
		}
	}
	b = startInstance(t, bin, "b-again", env) // joins again
	opts.Seed = 8
	produceAll(t, addr, opts, second)
	want := int64(first + second + shift)
	testenv.Eventually(t, 120*time.Second, func() bool { return total() >= want },
		"%d events counted after the reset (have %d)", want, total())
	out := runCommand(t, bin, env, "offsets-after", "offsets")
	if !strings.Contains(out, topic) {
		t.Errorf("ratchet offsets names no partition of %s:\n%s", topic, out)
	}
	runCommand(t, bin, env, "dlq-ls", "dlq", "ls")
	a.term(t)
	b.term(t)

	if n := total(); n != want {
		t.Errorf("counted %d events, want %d (%d + %d produced, %d replayed by the reset)", n, want, first, second, shift)
	}
	if n := deadLetters(t, pool); n != 0 {
		t.Errorf("%d events dead-lettered", n)
	}
}

// runCommand runs a ratchet command with env, expects exit 0 and returns its
// output, which it also keeps with the instances' logs.
func runCommand(tb testing.TB, bin string, env []string, name string, args ...string) string {
	tb.Helper()
	out, err := tryCommand(tb, bin, env, name, args...)
	if err != nil {
		tb.Fatalf("ratchet %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// tryCommand is runCommand returning the command's error.
func tryCommand(tb testing.TB, bin string, env []string, name string, args ...string) (string, error) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	_ = os.WriteFile(filepath.Join(logDir(tb), name+".log"), out, 0o644)
	return string(out), err
}

// deadLetters counts the dead-letter rows of exactly-once mode.
func deadLetters(tb testing.TB, pool *pgxpool.Pool) int64 {
	tb.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM ratchet_dead_letters`).Scan(&n); err != nil {
		tb.Fatal(err)
	}
	return n
}

// assertNoPreparedStatements fails tb when any log line of the instances,
// the commands or the pooler mentions a prepared statement.
func assertNoPreparedStatements(tb testing.TB, dir string, pooler *testenv.PgBouncer) {
	tb.Helper()
	logs := map[string]string{"pgbouncer": pooler.Log()}
	files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	if len(files) == 0 {
		tb.Errorf("no logs in %s", dir)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			tb.Error(err)
			continue
		}
		logs[filepath.Base(f)] = string(b)
	}
	for name, text := range logs {
		for _, line := range strings.Split(text, "\n") {
			if strings.Contains(strings.ToLower(line), "prepared statement") {
				tb.Errorf("%s: %s", name, line)
			}
		}
	}
}
