package engine_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"ratchet/config"
	"ratchet/internal/store"
	"ratchet/internal/testenv"
	"ratchet/processor"
)

// gate is a ledger that, once armed, holds the next batch inside its
// transaction until released: a process paused mid-batch (GC pause, stopped
// container, overloaded node).
type gate struct {
	ledger
	armed    atomic.Bool
	held     chan struct{} // closed when a batch is being held
	release  chan struct{}
	holdOnce sync.Once
}

func (g *gate) Process(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
	if len(b.Records) > 0 && g.armed.CompareAndSwap(true, false) {
		g.holdOnce.Do(func() { close(g.held) })
		<-g.release // a paused process does not notice anything
	}
	return g.ledger.Process(ctx, tx, b)
}

// TestZombieInstanceIsFenced pauses an instance inside a batch
// transaction, lets a new owner claim its partitions (what the new owner's
// assignment does: epoch + 1 in ratchet_offsets), and wakes it up: its
// transaction must be refused, logged and counted, and nothing counted
// twice. The claim is made directly rather than through a second consumer:
// in-process, the paused instance's own consumer notices a lost session and
// cancels the batch before it can write, which would prove nothing about the
// guard; a frozen process (SIGSTOP, a long GC or VM pause) does not.
func TestZombieInstanceIsFenced(t *testing.T) {
	_, addr := testenv.Kafka(t, 4, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
	cfg.Shutdown.Timeout = 5 * time.Second

	s := stream(t, addr, 20, 20*time.Millisecond)
	g := &gate{ledger: ledger{"zombie"}, held: make(chan struct{}), release: make(chan struct{})}
	zreg := prometheus.NewRegistry()
	zlogs := &testenv.Buffer{}
	z := runWithLogs(t, cfg, g, zreg, zlogs)
	waitOwnerApplies(t, pool, "zombie")
	g.armed.Store(true)
	<-g.held // the zombie is inside a transaction, frozen

	for p := range int32(4) {
		cl, err := store.ClaimPartition(context.Background(), pool, cfg.Kafka.GroupID, topic, p, "new-owner", 0)
		if err != nil {
			t.Fatal(err)
		}
		if cl.Epoch != 2 {
			t.Fatalf("partition %d claimed at epoch %d, want 2", p, cl.Epoch)
		}
	}
	// A batch that moved its offset before a claim commits first (the claim
	// waits for its row lock); everything after this count must be refused.
	before := count(t, pool, `SELECT count(*) FROM test_ledger`)
	close(g.release) // the zombie wakes up and finishes its batch
	// Events keep coming until every zombie partition has tried a batch
	// and been refused; then nothing it did after the claim may be
	// committed. A fenced partition never writes again, so each is
	// refused once: four refusals, every one under the old epoch (the
	// zombie's registry counts only its own).
	fenced := func() float64 { return testutil.ToFloat64(metricVec(t, zreg, "ratchet_fenced_writes_total")) }
	testenv.Eventually(t, 60*time.Second, func() bool { return fenced() >= 4 },
		"all four zombie partitions refused")
	s.stop()
	z.Stop(t)
	if got := fenced(); got != 4 {
		t.Errorf("ratchet_fenced_writes_total = %v, want 4: one refusal per partition", got)
	}
	// The refusal is logged at error, the one line an operator sees
	// (README, Guarantees): it names the fence and the old epoch.
	lines := zlogs.Lines(`"msg":"batch refused by the offset guard; partition stopped"`)
	if len(lines) != 4 {
		t.Errorf("%d refusal lines, want 4", len(lines))
	}
	for _, l := range lines {
		if !strings.Contains(l, `"level":"ERROR"`) || !strings.Contains(l, "fenced") || !strings.Contains(l, `"epoch":1`) {
			t.Errorf("refusal line should be an error naming the fence and the old epoch: %s", l)
		}
	}
	if after := count(t, pool, `SELECT count(*) FROM test_ledger`); after != before {
		t.Errorf("the fenced instance committed %d rows after the new owner's claim", after-before)
	}
	var epochs, next int64
	if err := pool.QueryRow(context.Background(), `SELECT min(epoch), count(*) FROM ratchet_offsets`).Scan(&epochs, &next); err != nil {
		t.Fatal(err)
	}
	if epochs != 2 {
		t.Errorf("a fenced write moved the claim: min epoch %d", epochs)
	}
	if dup := count(t, pool, `SELECT count(*) - count(DISTINCT id) FROM test_ledger`); dup != 0 {
		t.Errorf("%d events counted twice", dup)
	}
}
