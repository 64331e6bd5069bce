package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/internal/store"
	"ratchet/internal/testenv"
)

// testCtx returns a context that ends with the test or after a minute.
func testCtx(tb testing.TB) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	tb.Cleanup(cancel)
	return ctx
}

// openPool opens a pool on url, closed when the test ends.
func openPool(tb testing.TB, url string, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	pool, err := store.Open(testCtx(tb), url, maxConns)
	if err != nil {
		tb.Fatalf("open: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// migratedPool returns a pool on a fresh, migrated database.
func migratedPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool := openPool(tb, testenv.Postgres(tb), 8)
	if err := store.Migrate(testCtx(tb), pool); err != nil {
		tb.Fatalf("migrate: %v", err)
	}
	return pool
}
