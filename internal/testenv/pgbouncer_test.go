package testenv_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"ratchet/internal/testenv"
)

// TestPgBouncerTransactionMode: the harness's pooler is in transaction mode
// (session state does not survive a transaction), and a restart cuts the
// client and accepts the next connection on the same address.
func TestPgBouncerTransactionMode(t *testing.T) {
	b := testenv.StartPgBouncer(t, testenv.Postgres(t), testenv.PgBouncerOptions{PoolSize: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	connect := func() *pgx.Conn {
		cfg, err := pgx.ParseConfig(b.URL())
		if err != nil {
			t.Fatal(err)
		}
		cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatalf("connect through pgbouncer: %v", err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	c := connect()
	if rows := b.Admin(t, "SHOW CONFIG"); !hasRow(rows, "pool_mode", "transaction") {
		t.Fatalf("pool_mode is not transaction: %v", rows)
	}
	var one int
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 through pgbouncer = %d, %v", one, err)
	}

	b.Restart(t)
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err == nil {
		t.Fatal("a query on a connection from before the restart succeeded")
	}
	c = connect()
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("SELECT 1 after the restart: %v", err)
	}
}

func hasRow(rows [][]string, key, value string) bool {
	for _, r := range rows {
		if len(r) >= 2 && r[0] == key && r[1] == value {
			return true
		}
	}
	return false
}
