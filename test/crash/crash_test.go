// Package crash proves exactly-once under kill -9: real ratchet processes
// are killed at random moments and restarted while events flow, and the
// dashboard must still count every event exactly once.
package crash

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/internal/event"
	"ratchet/internal/produce"
	"ratchet/internal/testenv"
)

const topic = "events"

// buildBinary builds cmd/ratchet for the test.
func buildBinary(tb testing.TB) string {
	tb.Helper()
	return testenv.BuildRatchet(tb, "")
}

type instance struct {
	name string
	cmd  *exec.Cmd
	done chan error
}

// logDirs holds each test's directory of instance logs, by test name: a
// test's TempDir is removed when it ends, so it cannot be shared.
var (
	logDirsMu sync.Mutex
	logDirs   = map[string]string{}
)

// logDir returns tb's directory of instance logs (RATCHET_TEST_LOG_DIR,
// else a temporary one) and shows the logs' tails if tb fails.
func logDir(tb testing.TB) string {
	logDirsMu.Lock()
	defer logDirsMu.Unlock()
	if d, ok := logDirs[tb.Name()]; ok {
		return d
	}
	d := tb.TempDir()
	if env := os.Getenv("RATCHET_TEST_LOG_DIR"); env != "" {
		d = env
	}
	logDirs[tb.Name()] = d
	tb.Cleanup(func() {
		logDirsMu.Lock()
		delete(logDirs, tb.Name()) // -count=N runs the test again, with a new TempDir
		logDirsMu.Unlock()
		if tb.Failed() {
			out, _ := exec.Command("bash", "-c", "tail -n 15 "+d+"/*.log | cut -c1-400").CombinedOutput()
			tb.Logf("instance logs:\n%s", out)
		}
	})
	return d
}

func startInstance(tb testing.TB, bin, name string, env []string) *instance {
	tb.Helper()
	return startInstanceArgs(tb, bin, name, env, "run")
}

// startInstanceArgs starts the ratchet binary with args (a command and
// its flags) and env, logging to name.log.
func startInstanceArgs(tb testing.TB, bin, name string, env []string, args ...string) *instance {
	tb.Helper()
	logf, err := os.Create(filepath.Join(logDir(tb), name+".log"))
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "RATCHET_KAFKA_INSTANCE_ID=", "RATCHET_LOG_LEVEL=warn")
	cmd.Env = append(cmd.Env, env...) // the test's settings win
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", name, err)
	}
	in := &instance{name: name, cmd: cmd, done: make(chan error, 1)}
	go func() { in.done <- cmd.Wait(); logf.Close() }() // ends when the process exits
	return in
}

func (in *instance) kill() { _ = in.cmd.Process.Signal(syscall.SIGKILL); <-in.done }

func (in *instance) term(tb testing.TB) {
	tb.Helper()
	_ = in.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-in.done:
		if err != nil {
			tb.Errorf("%s did not stop cleanly: %v", in.name, err)
		}
	case <-time.After(60 * time.Second):
		tb.Errorf("%s did not stop within 60s", in.name)
		in.kill()
	}
}

type key struct {
	metric string
	bucket time.Time
}

type agg struct {
	count int64
	sum   float64
}

func TestKillNineThreeInstancesCountsEveryEventOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("long crash test")
	}
	const events = 300_000
	const kills = 15
	addr := testenv.MockKafka(t, 12, topic, topic+".dlq")
	dbURL := testenv.Postgres(t)
	bin := buildBinary(t)
	env := []string{
		"RATCHET_KAFKA_BROKERS=" + addr, "RATCHET_POSTGRES_URL=" + dbURL, "RATCHET_COMMIT_MODE=exactly-once",
		"RATCHET_HTTP_ADDR=", "RATCHET_KAFKA_PROPERTIES=session.timeout.ms=6000,heartbeat.interval.ms=500,max.poll.interval.ms=10000",
	}

	// The producer and the expected rollups come from the same generator.
	opts := produce.Options{Seed: 42, Format: event.FormatProtobuf, TimeSpread: 30 * time.Minute,
		Now: func() time.Time { return time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC) }}
	want := map[key]agg{}
	g := produce.NewGenerator(opts)
	for range events {
		_, _, ev, _ := g.Next()
		k := key{ev.Metric, ev.Time.AsTime().UTC().Truncate(time.Minute)}
		a := want[k]
		a.count++
		a.sum += ev.Value
		want[k] = a
	}
	var produced sync.WaitGroup
	produced.Go(func() { produceAll(t, addr, opts, events) })

	var mu sync.Mutex
	insts := make([]*instance, 3)
	for i := range insts {
		insts[i] = startInstance(t, bin, fmt.Sprintf("i%d", i), env)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for k := range kills {
		time.Sleep(time.Duration(300+rng.IntN(1500)) * time.Millisecond) // the random moment of the fault
		i := rng.IntN(len(insts))
		mu.Lock()
		insts[i].kill()
		insts[i] = startInstance(t, bin, fmt.Sprintf("i%d-%d", i, k), env)
		mu.Unlock()
	}
	produced.Wait()

	pool, total := counted(t, dbURL)
	testenv.Eventually(t, 240*time.Second, func() bool { return total() >= events },
		"all %d events counted (have %d)", events, total())
	for _, in := range insts {
		in.term(t)
	}

	got := map[key]agg{}
	rows, err := pool.Query(context.Background(), `SELECT metric, bucket, count, sum FROM dashboard_rollups`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k key
		var a agg
		if err := rows.Scan(&k.metric, &k.bucket, &a.count, &a.sum); err != nil {
			t.Fatal(err)
		}
		k.bucket = k.bucket.UTC()
		got[k] = a
	}
	if len(got) != len(want) {
		t.Errorf("rollup rows: got %d, want %d", len(got), len(want))
	}
	for k, w := range want {
		g := got[k]
		if g.count != w.count || math.Abs(g.sum-w.sum) > 1e-6 {
			t.Errorf("%s %s: got count %d sum %v, want count %d sum %v", k.metric, k.bucket.Format(time.RFC3339), g.count, g.sum, w.count, w.sum)
		}
	}
	if n := total(); n != events {
		t.Errorf("counted %d events, produced %d", n, events)
	}
}

// counted opens a pool on dbURL (closed when the test ends) and returns it
// with a function that reads how many events the dashboard has counted.
func counted(tb testing.TB, dbURL string) (*pgxpool.Pool, func() int64) {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool, func() int64 {
		var n int64
		_ = pool.QueryRow(context.Background(), `SELECT coalesce(sum(count),0) FROM dashboard_rollups`).Scan(&n)
		return n
	}
}

// produceAll writes the generator's events at a steady pace so that the
// kills land while they flow.
func produceAll(tb testing.TB, addr string, opts produce.Options, n int) {
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": addr, "linger.ms": 5,
		"enable.idempotence": true, "acks": "all", "log_level": 3})
	if err != nil {
		tb.Error(err)
		return
	}
	defer p.Close()
	deliveries := make(chan kafka.Event, 10_000)
	failed := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		for range n {
			d := <-deliveries
			if m := d.(*kafka.Message); m.TopicPartition.Error != nil {
				select {
				case failed <- m.TopicPartition.Error:
				default:
				}
			}
		}
	})
	g := produce.NewGenerator(opts)
	t := topic
	for i := range n {
		k, v, _, _ := g.Next()
		for {
			err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &t, Partition: kafka.PartitionAny},
				Key: k, Value: v}, deliveries)
			if err == nil {
				break
			}
			p.Flush(50)
		}
		if i%2000 == 1999 {
			time.Sleep(60 * time.Millisecond) // pacing: about 30,000 events/s
		}
	}
	wg.Wait()
	select {
	case err := <-failed:
		tb.Errorf("delivery failed: %v", err)
	default:
	}
}
