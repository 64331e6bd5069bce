package engine_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"ratchet/config"
	"ratchet/internal/testenv"
	"ratchet/processor"
)

// givenUpLine is the error line abandon writes per partition in
// at-least-once mode.
const givenUpLine = `"msg":"applied offsets left uncommitted; the next owner replays them"`

// assertGivenUp checks that the log has one error line per partition, each
// naming the uncommitted offset and the records the next owner replays,
// and that the metrics count the partitions and the records.
func assertGivenUp(tb testing.TB, logs *testenv.Buffer, reg *prometheus.Registry, partitions, perPartition int) {
	tb.Helper()
	lines := logs.Lines(givenUpLine)
	if len(lines) != partitions {
		tb.Errorf("%d lines giving up commits, want one per partition (%d):\n%s", len(lines), partitions,
			strings.Join(lines, "\n"))
	}
	seen := map[string]bool{}
	for _, l := range lines {
		if !strings.Contains(l, `"level":"ERROR"`) || !strings.Contains(l, `"offset":`+itoa(perPartition)) ||
			!strings.Contains(l, `"replay":`+itoa(perPartition)) {
			tb.Errorf("line should be an error naming offset %d and %d records to replay: %s", perPartition, perPartition, l)
		}
		i := strings.Index(l, `"partition":`)
		if i >= 0 {
			p := l[i : i+len(`"partition":`)+1]
			if seen[p] {
				tb.Errorf("partition reported twice: %s", l)
			}
			seen[p] = true
		}
	}
	abandoned := testutil.ToFloat64(metricVec(tb, reg, "ratchet_commits_abandoned_total"))
	records := testutil.ToFloat64(metricVec(tb, reg, "ratchet_uncommitted_records_total"))
	if abandoned != float64(partitions) {
		tb.Errorf("ratchet_commits_abandoned_total = %v, want %d", abandoned, partitions)
	}
	if records != float64(partitions*perPartition) {
		tb.Errorf("ratchet_uncommitted_records_total = %v, want %d", records, partitions*perPartition)
	}
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

// TestStopWithTheBrokerUnreachableEndsInTime stops an at-least-once engine
// while the broker answers no request of the group coordinator's
// connection (OffsetCommit dropped: kfake then serves nothing more on that
// connection, heartbeats included). The stop must still end within
// shutdown.timeout, give the commit up with one error line per partition
// naming the uncommitted offset and the records the next owner replays,
// and count them in ratchet_commits_abandoned_total and
// ratchet_uncommitted_records_total, once each.
func TestStopWithTheBrokerUnreachableEndsInTime(t *testing.T) {
	const (
		partitions   = 4
		perPartition = 50
		shutdown     = 5 * time.Second
	)
	cluster, addr := testenv.Kafka(t, partitions, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	cfg := testConfig(t, addr, dbURL, config.ModeAtLeastOnce)
	cfg.Shutdown.Timeout = shutdown
	cfg.Commit.Interval = time.Hour // nothing is committed before the stop
	produceBacklog(t, addr, partitions, perPartition, 10)

	reg, logs := prometheus.NewRegistry(), &testenv.Buffer{}
	e := runWithLogs(t, cfg, ledger{"stop"}, reg, logs)
	testenv.Eventually(t, 60*time.Second, func() bool {
		return count(t, pool, `SELECT count(*) FROM test_ledger`) == partitions*perPartition
	}, "every event applied")

	cluster.ControlKey(int16(kmsg.OffsetCommit), func(kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		return nil, nil, true // dropped: the broker is gone for this member
	})
	began := time.Now()
	e.Cancel()
	if err := e.Wait(t, shutdown+10*time.Second); err != nil {
		t.Errorf("engine stopped with error: %v", err)
	}
	took := time.Since(began)
	t.Logf("stopped %s after the request, shutdown.timeout %s", took.Round(time.Millisecond), shutdown)
	// The last waits end at the deadline itself (the committer is still
	// inside the dropped commit); what follows them is a few milliseconds.
	if took > shutdown+250*time.Millisecond {
		t.Errorf("the stop took %s, shutdown.timeout is %s", took.Round(time.Millisecond), shutdown)
	}
	assertGivenUp(t, logs, reg, partitions, perPartition)
}

// TestLostAssignmentReportsWhatItGivesUp makes an at-least-once member lose
// its assignment (the coordinator no longer knows it: UNKNOWN_MEMBER_ID on
// a heartbeat) while the offsets it applied are not yet committed. It
// commits nothing of those partitions (another member may own them) and
// says so as a stop would: one error line per partition with the
// uncommitted offset and the records replayed, counted in the metrics.
func TestLostAssignmentReportsWhatItGivesUp(t *testing.T) {
	const (
		partitions   = 4
		perPartition = 50
	)
	cluster, addr := testenv.Kafka(t, partitions, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	cfg := testConfig(t, addr, dbURL, config.ModeAtLeastOnce)
	cfg.Shutdown.Timeout = 5 * time.Second
	cfg.Commit.Interval = time.Hour // nothing is committed before the loss
	produceBacklog(t, addr, partitions, perPartition, 10)

	reg, logs := prometheus.NewRegistry(), &testenv.Buffer{}
	e := runWithLogs(t, cfg, ledger{"lost"}, reg, logs)
	testenv.Eventually(t, 60*time.Second, func() bool {
		return count(t, pool, `SELECT count(*) FROM test_ledger`) == partitions*perPartition
	}, "every event applied")

	cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Heartbeat}, Err: kerr.UnknownMemberID})
	testenv.Eventually(t, 30*time.Second, func() bool {
		return len(logs.Lines(`"msg":"assignment lost; stopping partitions without committing"`)) > 0
	}, "the assignment is lost")
	assertGivenUp(t, logs, reg, partitions, perPartition)
	e.Stop(t)
}

// deafProcessor holds every batch of partition 0, inside its transaction,
// until release is closed, whatever its context says: a processor that
// ignores cancellation.
type deafProcessor struct {
	release chan struct{}
	holding chan struct{} // closed once a batch is held
	once    sync.Once
}

func (*deafProcessor) Name() string { return "deaf" }

func (d *deafProcessor) Process(_ context.Context, _ pgx.Tx, b processor.Batch) error {
	if b.Partition == 0 {
		d.once.Do(func() { close(d.holding) })
		<-d.release
	}
	return nil
}

// TestStopEndsInTimeWhenAProcessorIgnoresItsContext stops an exactly-once
// engine while partition 0's batch sits in a processor that ignores its
// context: the partition actor cannot stop, and its transaction keeps a
// pool connection. The stop must still end within shutdown.timeout: the
// drain, the actors' stop and the pool's close are each bounded by what is
// left of it.
func TestStopEndsInTimeWhenAProcessorIgnoresItsContext(t *testing.T) {
	const shutdown = 4 * time.Second
	_, addr := testenv.Kafka(t, 2, topic)
	dbURL := testenv.Postgres(t)
	cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
	cfg.Shutdown.Timeout = shutdown
	d := &deafProcessor{release: make(chan struct{}), holding: make(chan struct{})}
	t.Cleanup(func() { close(d.release) }) // before the database is dropped
	produceBacklog(t, addr, 2, 20, 10)

	e := start(t, cfg, d, "deaf")
	select {
	case <-d.holding:
	case <-time.After(60 * time.Second):
		t.Fatal("no batch of partition 0 reached the processor")
	}
	began := time.Now()
	e.Cancel()
	if err := e.Wait(t, shutdown+30*time.Second); err != nil {
		t.Errorf("engine stopped with error: %v", err)
	}
	took := time.Since(began)
	t.Logf("stopped %s after the request, shutdown.timeout %s", took.Round(time.Millisecond), shutdown)
	if took > shutdown+250*time.Millisecond {
		t.Errorf("the stop took %s, shutdown.timeout is %s", took.Round(time.Millisecond), shutdown)
	}
}
