package store_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"ratchet/internal/store"
	"ratchet/internal/testenv"
)

func TestMigrateIdempotent(t *testing.T) {
	pool := migratedPool(t)
	if err := store.Migrate(testCtx(t), pool); err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	assertOneRowPerVersion(t, pool)

	type column struct{ table, name, typ, nullable string }
	rows, err := pool.Query(testCtx(t), `
SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns
WHERE table_schema = 'public' AND table_name IN ('dashboard_rollups', 'ratchet_offsets')
ORDER BY table_name, ordinal_position`)
	if err != nil {
		t.Fatal(err)
	}
	var got []column
	for rows.Next() {
		var c column
		if err := rows.Scan(&c.table, &c.name, &c.typ, &c.nullable); err != nil {
			t.Fatal(err)
		}
		got = append(got, c)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []column{
		{"dashboard_rollups", "metric", "text", "NO"},
		{"dashboard_rollups", "bucket", "timestamp with time zone", "NO"},
		{"dashboard_rollups", "count", "bigint", "NO"},
		{"dashboard_rollups", "sum", "double precision", "NO"},
		{"dashboard_rollups", "min", "double precision", "NO"},
		{"dashboard_rollups", "max", "double precision", "NO"},
		{"ratchet_offsets", "consumer_group", "text", "NO"},
		{"ratchet_offsets", "topic", "text", "NO"},
		{"ratchet_offsets", "partition", "integer", "NO"},
		{"ratchet_offsets", "next_offset", "bigint", "NO"},
		{"ratchet_offsets", "epoch", "bigint", "NO"},
		{"ratchet_offsets", "owner", "text", "NO"},
		{"ratchet_offsets", "updated_at", "timestamp with time zone", "NO"},
	}
	if len(got) != len(want) {
		t.Fatalf("columns = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("column %d = %v, want %v", i, got[i], want[i])
		}
	}

	for table, wantKey := range map[string]string{
		"dashboard_rollups": "metric,bucket",
		"ratchet_offsets":   "consumer_group,topic,partition",
	} {
		var key string
		err := pool.QueryRow(testCtx(t), `
SELECT string_agg(a.attname, ',' ORDER BY k.ord)
FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = $1::regclass AND i.indisprimary`, table).Scan(&key)
		if err != nil {
			t.Fatal(err)
		}
		if key != wantKey {
			t.Errorf("primary key of %s = %s, want %s", table, key, wantKey)
		}
	}
}

func TestMigrateConcurrent(t *testing.T) {
	url := testenv.Postgres(t)
	const instances = 4
	errs := make([]error, instances)
	var wg sync.WaitGroup
	for i := range instances {
		pool := openPool(t, url, 1) // one pool per instance, as separate processes would have
		wg.Go(func() { errs[i] = store.Migrate(testCtx(t), pool) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("instance %d: %v", i, err)
		}
	}
	assertOneRowPerVersion(t, openPool(t, url, 1))
}

func TestMigrations(t *testing.T) {
	ms, err := store.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) == 0 || ms[0].Version != 1 || ms[0].Name != "initial" {
		t.Fatalf("migrations = %+v, want 001_initial first", ms)
	}
	for i, m := range ms {
		if m.Version != i+1 {
			t.Errorf("migration %d has version %d; versions must be 1, 2, ... without holes", i, m.Version)
		}
	}
}

func assertOneRowPerVersion(tb testing.TB, pool interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}) {
	tb.Helper()
	ms, err := store.Migrations()
	if err != nil {
		tb.Fatal(err)
	}
	rows, err := pool.Query(testCtx(tb), "SELECT version, name FROM ratchet_schema_migrations ORDER BY version")
	if err != nil {
		tb.Fatal(err)
	}
	type applied struct {
		version int
		name    string
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (applied, error) {
		var a applied
		err := r.Scan(&a.version, &a.name)
		return a, err
	})
	if err != nil {
		tb.Fatal(err)
	}
	if len(got) != len(ms) {
		tb.Fatalf("ratchet_schema_migrations = %v, want one row per each of %d migrations", got, len(ms))
	}
	for i, m := range ms {
		if got[i].version != m.Version || got[i].name != m.Name {
			tb.Errorf("row %d = %v, want %d %s", i, got[i], m.Version, m.Name)
		}
	}
}
