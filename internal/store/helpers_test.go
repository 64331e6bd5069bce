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

// migratedPoolOf1 returns a pool of one connection on a fresh, migrated
// database, and the database's URL: a batch that left a transaction open
// or asked for a second connection would show.
func migratedPoolOf1(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	url := testenv.Postgres(tb)
	pool := openPool(tb, url, 1)
	if err := store.Migrate(testCtx(tb), pool); err != nil {
		tb.Fatalf("migrate: %v", err)
	}
	return pool, url
}

// openTransactions counts the connections to observer's database, its own
// left out, that sit idle inside a transaction.
func openTransactions(tb testing.TB, observer *pgxpool.Pool) int {
	tb.Helper()
	var n int
	err := observer.QueryRow(testCtx(tb), `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'`).Scan(&n)
	if err != nil {
		tb.Fatal(err)
	}
	return n
}
