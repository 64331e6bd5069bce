package store_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/internal/store"
	"ratchet/internal/testenv"
)

func TestClaimPartition(t *testing.T) {
	pool := migratedPool(t)
	ctx := testCtx(t)

	first, err := store.ClaimPartition(ctx, pool, "g", "events", 3, "a", 42)
	if err != nil {
		t.Fatal(err)
	}
	want := store.Claim{Group: "g", Topic: "events", Partition: 3, Epoch: 1, Owner: "a", Next: 42, New: true}
	if first != want {
		t.Fatalf("first claim = %+v, want %+v", first, want)
	}

	second, err := store.ClaimPartition(ctx, pool, "g", "events", 3, "b", 7)
	if err != nil {
		t.Fatal(err)
	}
	want = store.Claim{Group: "g", Topic: "events", Partition: 3, Epoch: 2, Owner: "b", Next: 42, New: false}
	if second != want {
		t.Fatalf("second claim = %+v, want %+v (the fallback only seeds a new row)", second, want)
	}

	// Other groups and partitions are independent rows.
	other, err := store.ClaimPartition(ctx, pool, "h", "events", 3, "a", 5)
	if err != nil {
		t.Fatal(err)
	}
	if other.Epoch != 1 || other.Next != 5 || !other.New {
		t.Fatalf("claim of another group = %+v, want a new row at 5", other)
	}
	if _, err := store.ClaimPartition(ctx, pool, "g", "events", 0, "a", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := store.ClaimPartition(ctx, pool, "g", "clicks", 1, "a", 9); err != nil {
		t.Fatal(err)
	}

	offsets, err := store.Offsets(ctx, pool, "g")
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		topic     string
		partition int32
		next      int64
		epoch     int64
		owner     string
	}
	wantRows := []row{{"clicks", 1, 9, 1, "a"}, {"events", 0, 0, 1, "a"}, {"events", 3, 42, 2, "b"}}
	if len(offsets) != len(wantRows) {
		t.Fatalf("Offsets = %+v, want %d rows", offsets, len(wantRows))
	}
	for i, o := range offsets {
		got := row{o.Topic, o.Partition, o.Next, o.Epoch, o.Owner}
		if got != wantRows[i] || o.Group != "g" || o.UpdatedAt.IsZero() {
			t.Errorf("Offsets[%d] = %+v, want %+v in group g with updated_at", i, o, wantRows[i])
		}
	}
}

func TestClaimPartitionRefusesNegativeFallback(t *testing.T) {
	pool := migratedPool(t)
	if _, err := store.ClaimPartition(testCtx(t), pool, "g", "events", 0, "a", -2); err == nil {
		t.Fatal("claim with fallback -2 succeeded")
	}
}

// countingTracer counts the statements sent through a pool.
type countingTracer struct{ n atomic.Int64 }

func (t *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	t.n.Add(1)
	return ctx
}

func (*countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestClaimPartitionsInOneRoundTrip: 1024 partitions, some claimed before,
// are claimed in one statement, each exactly as ClaimPartition claims it:
// a new row at its fallback with epoch 1, an existing row's epoch + 1 with
// its position kept. A negative fallback and a partition asked twice get
// their own errors; the others are claimed.
func TestClaimPartitionsInOneRoundTrip(t *testing.T) {
	url := testenv.Postgres(t)
	if err := store.Migrate(testCtx(t), openPool(t, url, 2)); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	tracer := &countingTracer{}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(testCtx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ctx := testCtx(t)
	for p := range int32(10) { // claimed before by another instance, moved on to 100+p
		if _, err := store.ClaimPartition(ctx, pool, "g", "events", p, "old", 100+int64(p)); err != nil {
			t.Fatal(err)
		}
	}

	var reqs []store.ClaimRequest
	for p := range int32(1024) {
		reqs = append(reqs, store.ClaimRequest{Topic: "events", Partition: p, Fallback: int64(p)})
	}
	reqs = append(reqs, store.ClaimRequest{Topic: "clicks", Partition: 0, Fallback: -1},
		store.ClaimRequest{Topic: "events", Partition: 5, Fallback: 0})
	before := tracer.n.Load()
	claims, errs := store.ClaimPartitions(ctx, pool, "g", "new", reqs)
	if n := tracer.n.Load() - before; n != 1 {
		t.Errorf("%d statements for 1024 partitions, want 1", n)
	}
	for i, r := range reqs[:1024] {
		want := store.Claim{Group: "g", Topic: "events", Partition: r.Partition, Epoch: 1, Owner: "new", Next: r.Fallback, New: true}
		if r.Partition < 10 {
			want.Epoch, want.Next, want.New = 2, 100+int64(r.Partition), false
		}
		if errs[i] != nil || claims[i] != want {
			t.Fatalf("claim %d = %+v, %v; want %+v", i, claims[i], errs[i], want)
		}
	}
	if errs[1024] == nil || errs[1025] == nil {
		t.Errorf("negative fallback: %v; asked twice: %v; want errors", errs[1024], errs[1025])
	}
	offsets, err := store.Offsets(ctx, pool, "g")
	if err != nil || len(offsets) != 1024 {
		t.Fatalf("%d rows (%v), want 1024", len(offsets), err)
	}
	for _, o := range offsets {
		if o.Owner != "new" {
			t.Fatalf("row %+v not owned by the new claim", o)
		}
	}

	// Claimed again in one statement: every epoch + 1, positions kept.
	claims, errs = store.ClaimPartitions(ctx, pool, "g", "again", reqs[:1024])
	for i := range claims {
		if errs[i] != nil || claims[i].Epoch != 2+boolInt(i < 10) || claims[i].New {
			t.Fatalf("second claim %d = %+v, %v", i, claims[i], errs[i])
		}
	}
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// TestClaimPartitionsFailTogether: a statement that fails is the error of
// every partition in it, and claims none of them.
func TestClaimPartitionsFailTogether(t *testing.T) {
	pool := migratedPool(t)
	ctx, cancel := context.WithCancel(testCtx(t))
	cancel()
	_, errs := store.ClaimPartitions(ctx, pool, "g", "a", []store.ClaimRequest{
		{Topic: "events", Partition: 0, Fallback: 0}, {Topic: "events", Partition: 1, Fallback: 0}})
	for i, err := range errs {
		if err == nil {
			t.Errorf("partition %d claimed with a cancelled context", i)
		}
	}
	if offsets, err := store.Offsets(testCtx(t), pool, "g"); err != nil || len(offsets) != 0 {
		t.Errorf("rows %+v (%v), want none", offsets, err)
	}
}
