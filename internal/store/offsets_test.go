package store_test

import (
	"testing"

	"ratchet/internal/store"
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
