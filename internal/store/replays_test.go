package store_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/internal/store"
	"ratchet/internal/testenv"
)

// TestReplayLeaseExcludesAndExpires: a held lease refuses a second run
// for as long as its holder renews it, and for no longer; a holder that
// dies without releasing it (its renewal stops, as at a kill -9) blocks
// the next run only until the lease expires; a late release does not
// free the next holder's lease. Nothing depends on the session: every
// statement may run on another connection.
func TestReplayLeaseExcludesAndExpires(t *testing.T) {
	pool := migratedPool(t)
	defer func(d time.Duration) { store.ReplayLeaseTTL = d }(store.ReplayLeaseTTL)
	store.ReplayLeaseTTL = 2 * time.Second
	ctx := testCtx(t)

	aCtx, killA := context.WithCancel(ctx)
	a, err := store.LockReplays(aCtx, pool, "events.dlq", "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.LockReplays(ctx, pool, "events.dlq", "b"); !errors.Is(err, store.ErrReplayRunning) {
		t.Fatalf("second lock while the first is held: %v, want ErrReplayRunning", err)
	}
	// Another topic is not excluded.
	other, err := store.LockReplays(ctx, pool, "other.dlq", "b")
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A renews: past two lease lengths, B is still refused.
	first := leaseExpiry(t, pool, "events.dlq")
	testenv.Eventually(t, 10*time.Second, func() bool {
		return leaseExpiry(t, pool, "events.dlq").Sub(first) > 2*store.ReplayLeaseTTL
	}, "the lease is renewed past two lease lengths")
	if _, err := store.LockReplays(ctx, pool, "events.dlq", "b"); !errors.Is(err, store.ErrReplayRunning) {
		t.Fatalf("lock while the holder renews: %v, want ErrReplayRunning", err)
	}

	// A dies without releasing: B gets the lease once it expired.
	killA()
	killedAt := time.Now()
	var b *store.ReplayLease
	testenv.Eventually(t, 10*time.Second, func() bool {
		b, err = store.LockReplays(ctx, pool, "events.dlq", "b")
		return err == nil
	}, "the dead holder's lease expires (last error %v)", err)
	t.Logf("lease taken %v after its holder stopped renewing (TTL %v)", time.Since(killedAt).Round(time.Millisecond), store.ReplayLeaseTTL)
	// A's late release leaves B's lease alone.
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if owner := leaseOwner(t, pool, "events.dlq"); owner != "b" {
		t.Fatalf("after the dead holder's release the lease is %q's, want b's", owner)
	}
	if _, err := store.LockReplays(ctx, pool, "events.dlq", "c"); !errors.Is(err, store.ErrReplayRunning) {
		t.Fatalf("lock while b holds it: %v", err)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := store.LockReplays(ctx, pool, "events.dlq", "c")
	if err != nil {
		t.Fatalf("lock after a release: %v", err)
	}
	_ = c.Release(ctx)
}

// TestReplayLeaseLostWhenTaken: a holder that stalled past its lease while
// another run took it learns so at its next renewal.
func TestReplayLeaseLostWhenTaken(t *testing.T) {
	pool := migratedPool(t)
	defer func(d time.Duration) { store.ReplayLeaseTTL = d }(store.ReplayLeaseTTL)
	store.ReplayLeaseTTL = 600 * time.Millisecond
	ctx := testCtx(t)
	a, err := store.LockReplays(ctx, pool, "events.dlq", "a")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	// As if A had stalled past its expiry and B had taken the lease.
	if _, err := pool.Exec(ctx, `UPDATE ratchet_replay_leases SET owner = 'b' WHERE dlq_topic = 'events.dlq'`); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the holder does not notice that its lease was taken")
	}
}

// TestReplayLeaseLostBeforeTakenWhenCut: run A's link to PostgreSQL is cut
// (a real TCP cut, nothing else disturbed) while it holds the lease. A
// cannot renew; run B, which reaches the database, takes the lease once it
// expired by the database's clock. By then A's Lost() must be closed, with
// a reason that says it could not renew: two holders at once would both
// produce.
func TestReplayLeaseLostBeforeTakenWhenCut(t *testing.T) {
	defer func(d time.Duration) { store.ReplayLeaseTTL = d }(store.ReplayLeaseTTL)
	store.ReplayLeaseTTL = 3 * time.Second
	ctx := testCtx(t)
	bPool := migratedPool(t)
	u, err := url.Parse(bPool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	aPool := openPool(t, u.String(), 2)

	a, err := store.LockReplays(ctx, aPool, "events.dlq", "a")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	lostAt := make(chan time.Time, 1)
	go func() { // ends when A's lease is lost or the test ends
		select {
		case <-a.Lost():
			lostAt <- time.Now()
		case <-ctx.Done():
		}
	}()
	// Let one renewal through first: the deadline then counts from it.
	first := leaseExpiry(t, bPool, "events.dlq")
	testenv.Eventually(t, 10*time.Second, func() bool { return leaseExpiry(t, bPool, "events.dlq").After(first) },
		"A renews its lease")
	proxy.Cut()
	cut := time.Now()

	var takenAt time.Time
	testenv.Eventually(t, 20*time.Second, func() bool {
		b, err := store.LockReplays(ctx, bPool, "events.dlq", "b")
		if err != nil {
			return false
		}
		takenAt = time.Now()
		t.Cleanup(func() { _ = b.Release(context.Background()) })
		return true
	}, "B takes the lease of A, cut off from the database")
	select {
	case at := <-lostAt:
		t.Logf("A gave the lease up %v after the cut; B took it %v after the cut (TTL %v)",
			at.Sub(cut).Round(time.Millisecond), takenAt.Sub(cut).Round(time.Millisecond), store.ReplayLeaseTTL)
	default:
		t.Fatalf("B took the lease %v after A's link was cut, and A's Lost() is still open: two replays at once",
			takenAt.Sub(cut).Round(time.Millisecond))
	}
	if err := a.Err(); !errors.Is(err, store.ErrReplayLeaseLost) || !strings.Contains(err.Error(), "not renewed") {
		t.Errorf("A's reason: %v, want ErrReplayLeaseLost saying it was not renewed", err)
	}
}

// TestReplayLeaseClaimBoundedByItsDeadline: a claim the database answers
// later than the holder's deadline would be worth nothing: LockReplays
// gives up by then with an error that says so, instead of waiting for the
// answer.
func TestReplayLeaseClaimBoundedByItsDeadline(t *testing.T) {
	defer func(d time.Duration) { store.ReplayLeaseTTL = d }(store.ReplayLeaseTTL)
	store.ReplayLeaseTTL = 3 * time.Second
	ctx := testCtx(t)
	direct := migratedPool(t)
	u, err := url.Parse(direct.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	slow := openPool(t, u.String(), 1)
	if err := slow.Ping(ctx); err != nil { // connected before the link slows
		t.Fatal(err)
	}
	proxy.Delay(2 * time.Second) // each way: a round trip of 4 s
	start := time.Now()
	l, err := store.LockReplays(ctx, slow, "events.dlq", "a")
	took := time.Since(start)
	if err == nil {
		_ = l.Release(ctx)
		t.Fatalf("a claim answered after %v (the holder's deadline is %v) returned a lease", took.Round(time.Millisecond),
			store.ReplayLeaseTTL*4/5)
	}
	if !strings.Contains(err.Error(), "not answered within") || took > store.ReplayLeaseTTL {
		t.Errorf("after %v: %v, want an error naming the claim's bound within the lease's TTL", took.Round(time.Millisecond), err)
	}
}

func leaseExpiry(tb testing.TB, pool *pgxpool.Pool, topic string) time.Time {
	tb.Helper()
	var at time.Time
	if err := pool.QueryRow(testCtx(tb), `SELECT expires_at FROM ratchet_replay_leases WHERE dlq_topic = $1`, topic).Scan(&at); err != nil {
		tb.Fatal(err)
	}
	return at
}

func leaseOwner(tb testing.TB, pool *pgxpool.Pool, topic string) string {
	tb.Helper()
	var o string
	if err := pool.QueryRow(testCtx(tb), `SELECT owner FROM ratchet_replay_leases WHERE dlq_topic = $1`, topic).Scan(&o); err != nil {
		tb.Fatal(err)
	}
	return o
}

// TestMigration005KeepsReplays: rows written by a replay before migration
// 005 stay (done, same key), are marked legacy, and learn the topic and
// partition they were produced to.
func TestMigration005KeepsReplays(t *testing.T) {
	ctx := testCtx(t)
	pool := openPool(t, testenv.Postgres(t), 2)
	ms, err := store.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	// The schema as of migration 004, as a database upgraded from it has.
	if _, err := pool.Exec(ctx, `CREATE TABLE ratchet_schema_migrations (version int PRIMARY KEY, name text NOT NULL,
applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms[:4] {
		if _, err := pool.Exec(ctx, m.SQL); err != nil {
			t.Fatalf("%03d: %v", m.Version, err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO ratchet_schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		state := "done"
		if i == 2 {
			state = "pending"
		}
		if _, err := pool.Exec(ctx, `INSERT INTO ratchet_replays (dlq_topic, dlq_partition, dlq_offset, topic, partition,
source_offset, state, search_from, replayed_offset) VALUES ('events.dlq', 0, $1, 'events', 1, $2, $3, 7, $4)`,
			i, 100+i, state, map[bool]any{true: nil, false: int64(7 + i)}[state == "pending"]); err != nil {
			t.Fatal(err)
		}
	}
	if err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	rows, err := store.Replays(ctx, pool, "events.dlq")
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(rows)
	if len(rows) != 3 {
		t.Fatalf("rows after the migration: %s", got)
	}
	for i, r := range rows {
		want := store.ReplayDone
		if i == 2 {
			want = store.ReplayPending
		}
		if r.DLQOffset != int64(i) || r.State != want || !r.Legacy || r.ToTopic != "events" || r.ToPartition != 1 || r.Group != "" ||
			r.SourceOffset != int64(100+i) {
			t.Errorf("row %d after the migration: %+v", i, r)
		}
	}
	// New rows are not legacy.
	if err := store.MarkReplaysPending(ctx, pool, []store.Replay{{DLQTopic: "events.dlq", DLQPartition: 1, DLQOffset: 0,
		Topic: "events", Partition: 0, SourceOffset: 5, ToTopic: "mine", ToPartition: 0, Group: "g", SearchFrom: 3}}, nil); err != nil {
		t.Fatal(err)
	}
	rows, err = store.Replays(ctx, pool, "events.dlq")
	if err != nil {
		t.Fatal(err)
	}
	if r := rows[3]; r.Legacy || r.ToTopic != "mine" || r.Group != "g" || r.State != store.ReplayPending {
		t.Errorf("a new row: %+v", r)
	}
}
