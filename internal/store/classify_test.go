package store_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"ratchet/internal/store"
	"ratchet/internal/testenv"
	"ratchet/processor"
)

func TestClassify(t *testing.T) {
	pg := func(code string) error { return &pgconn.PgError{Code: code, Message: "x"} }
	tests := []struct {
		name      string
		err       error
		transient bool
		record    bool
		config    bool
	}{
		{"nil", nil, false, false, false},
		{"plain", errors.New("x"), false, false, false},
		{"canceled", context.Canceled, false, false, false},
		{"deadline exceeded", context.DeadlineExceeded, true, false, false},
		{"eof", io.EOF, true, false, false},
		{"unexpected eof wrapped", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true, false, false},
		{"net op error", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true, false, false},
		{"connection exception 08006", pg("08006"), true, false, false},
		{"connection exception 08001 wrapped", fmt.Errorf("apply: %w", pg("08001")), true, false, false},
		{"too many connections 53300", pg("53300"), true, false, false},
		{"disk full 53100", pg("53100"), true, false, false},
		{"admin shutdown 57P01", pg("57P01"), true, false, false},
		{"crash shutdown 57P02", pg("57P02"), true, false, false},
		{"cannot connect now 57P03", pg("57P03"), true, false, false},
		{"query canceled 57014", pg("57014"), false, false, false},
		{"serialization failure 40001", pg("40001"), true, false, false},
		{"deadlock 40P01", pg("40P01"), true, false, false},
		{"transaction rollback 40000", pg("40000"), false, false, false},
		{"division by zero 22012", pg("22012"), false, true, false},
		{"numeric out of range 22003", pg("22003"), false, true, false},
		{"unique violation 23505", pg("23505"), false, true, false},
		{"not null 23502 wrapped", fmt.Errorf("x: %w", pg("23502")), false, true, false},
		{"undefined table 42P01", pg("42P01"), false, false, true},
		{"permanent", processor.Permanent(errors.New("bad event")), false, true, false},
		{"permanent wrapping a deadlock", processor.Permanent(pg("40P01")), false, true, false},
		{"permanent wrapping eof", fmt.Errorf("x: %w", processor.Permanent(io.EOF)), false, true, false},
		{"tx closed", pgx.ErrTxClosed, false, false, false},
		{"pooler protocol violation 08P01", pg("08P01"), true, false, false},
		{"prepared statement missing 26000", pg("26000"), false, false, true},
		{"prepared statement exists 42P05", fmt.Errorf("apply: %w", pg("42P05")), false, false, true},
		{"no arbiter 42P10", pg("42P10"), false, false, true},
		{"deferrable arbiter 55000", pg("55000"), false, false, true},
		{"lock not available 55P03", pg("55P03"), true, false, false},
		{"datatype mismatch 42804", pg("42804"), false, false, true},
		{"undefined column 42703", pg("42703"), false, false, true},
		{"permission 42501", pg("42501"), false, false, true},
		{"undefined function 42883", pg("42883"), false, false, true},
		{"feature not supported 0A000", pg("0A000"), false, false, true},
		{"schema missing 3F000", pg("3F000"), false, false, true},
		{"read-only transaction 25006", pg("25006"), false, false, true},
		{"cardinality 21000", pg("21000"), false, false, true},
		{"permanent wrapping an undefined column", processor.Permanent(pg("42703")), false, false, true},
		{"raise exception P0001", pg("P0001"), false, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := store.IsTransient(tt.err); got != tt.transient {
				t.Errorf("IsTransient(%v) = %v, want %v", tt.err, got, tt.transient)
			}
			if got := store.IsRecordError(tt.err); got != tt.record {
				t.Errorf("IsRecordError(%v) = %v, want %v", tt.err, got, tt.record)
			}
			if got := store.IsConfigurationError(tt.err) || store.IsPreparedStatementError(tt.err); got != tt.config {
				t.Errorf("configuration error(%v) = %v, want %v", tt.err, got, tt.config)
			}
		})
	}
}

// TestPreparedStatementError: the two prepared-statement refusals are a
// configuration problem, and Explain says what to change (once).
func TestPreparedStatementError(t *testing.T) {
	pg := func(code string) error {
		return &pgconn.PgError{Code: code, Message: "prepared statement \"stmtcache_1\""}
	}
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"26000", pg("26000"), true},
		{"42P05 wrapped", fmt.Errorf("migrate: %w", pg("42P05")), true},
		{"undefined table 42P01", pg("42P01"), false},
		{"eof", io.EOF, false},
		{"nil", nil, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := store.IsPreparedStatementError(tt.err); got != tt.want {
				t.Fatalf("IsPreparedStatementError(%v) = %v, want %v", tt.err, got, tt.want)
			}
			explained := store.Explain(tt.err)
			var ce *store.ConfigError
			if got := errors.As(explained, &ce); got != tt.want {
				t.Fatalf("Explain(%v) = %v: a *ConfigError: %v, want %v", tt.err, explained, got, tt.want)
			}
			if !tt.want {
				return
			}
			if !errors.Is(explained, tt.err) || store.IsTransient(explained) || store.IsRecordError(explained) {
				t.Errorf("Explain(%v) lost the cause or changed its class: %v", tt.err, explained)
			}
			if msg := store.Explain(explained).Error(); strings.Count(msg, "default_query_exec_mode") != 1 {
				t.Errorf("explained twice, or without what to change: %s", msg)
			}
		})
	}
}

// TestClassifyLive checks the predicates on errors produced by a real server
// and a real connection failure, not hand-built ones.
func TestClassifyLive(t *testing.T) {
	pool := migratedPool(t)
	ctx := testCtx(t)

	t.Run("refused", func(t *testing.T) {
		_, err := pgx.Connect(ctx, "postgres://u@127.0.0.1:1/x?sslmode=disable&connect_timeout=2")
		if err == nil || !store.IsTransient(err) || store.IsRecordError(err) {
			t.Fatalf("connect to a closed port: %v; want transient", err)
		}
	})
	t.Run("terminated backend", func(t *testing.T) {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		var pid uint32 = conn.Conn().PgConn().PID()
		if _, err := pool.Exec(ctx, "SELECT pg_terminate_backend($1, 5000)", pid); err != nil {
			t.Fatal(err)
		}
		_, err = conn.Exec(ctx, "SELECT 1")
		if err == nil || !store.IsTransient(err) {
			t.Fatalf("query on a terminated connection: %v; want transient", err)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		qctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := pool.Exec(qctx, "SELECT pg_sleep(5)")
		if err == nil || !store.IsTransient(err) {
			t.Fatalf("query past its deadline: %v; want transient", err)
		}
	})
	t.Run("canceled before the query", func(t *testing.T) {
		qctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := pool.Exec(qctx, "SELECT 1")
		if err == nil || store.IsTransient(err) {
			t.Fatalf("query with a canceled context: %v; want not transient", err)
		}
	})
	t.Run("data exception", func(t *testing.T) {
		_, err := pool.Exec(ctx, "SELECT 1 / (random() * 0)::int")
		if err == nil || store.IsTransient(err) || !store.IsRecordError(err) {
			t.Fatalf("division by zero: %v; want record error", err)
		}
	})
	// What a table that does not fit its statement answers: a
	// configuration error, every time, never a record's.
	t.Run("table faults", func(t *testing.T) {
		if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS cls_t; CREATE TABLE cls_t (a text, n text, d text UNIQUE DEFERRABLE, k text)`); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct{ name, sql, code string }{
			{"no arbiter", `INSERT INTO cls_t (a) VALUES ('x') ON CONFLICT (a) DO NOTHING`, "42P10"},
			{"deferrable arbiter", `INSERT INTO cls_t (d) VALUES ('x') ON CONFLICT (d) DO NOTHING`, "55000"},
			{"count into text", `UPDATE cls_t SET n = COALESCE(n, 0) + 1`, "42804"},
			{"undefined column", `INSERT INTO cls_t (nope) VALUES ('x')`, "42703"},
			{"undefined table", `INSERT INTO cls_nope (a) VALUES ('x')`, "42P01"},
		} {
			_, err := pool.Exec(ctx, tc.sql)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != tc.code {
				t.Errorf("%s: %v, want SQLSTATE %s", tc.name, err, tc.code)
				continue
			}
			if !store.IsConfigurationError(err) || store.IsRecordError(err) || store.IsTransient(err) {
				t.Errorf("%s (%s): want a configuration error only", tc.name, tc.code)
			}
		}
	})
	t.Run("constraint", func(t *testing.T) {
		_, err := pool.Exec(ctx, "INSERT INTO ratchet_offsets (consumer_group, topic, partition, next_offset, epoch, owner) VALUES ('g', 't', 0, -1, 1, 'a')")
		if err == nil || store.IsTransient(err) || !store.IsRecordError(err) {
			t.Fatalf("check violation: %v; want record error", err)
		}
	})
}

// TestClassifyPooler checks the predicates on what a real PgBouncer in
// transaction mode answers: its outages (the server unreachable, the pooler
// paused past query_wait_timeout, its connections killed, the pooler
// restarted) are transient; a named prepared statement that meets another
// client's on a shared server session is a configuration error.
func TestClassifyPooler(t *testing.T) {
	ctx := testCtx(t)
	connect := func(t *testing.T, url, mode string) *pgx.Conn {
		t.Helper()
		cfg, err := pgx.ParseConfig(url + "&default_query_exec_mode=" + mode)
		if err != nil {
			t.Fatal(err)
		}
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatalf("connect through pgbouncer: %v", err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	expect := func(t *testing.T, what string, err error, transient bool) {
		t.Helper()
		t.Logf("%s: %v", what, err)
		if err == nil {
			t.Fatalf("%s: no error", what)
		}
		if store.IsTransient(err) != transient || store.IsRecordError(err) {
			t.Fatalf("%s: %v; want transient %v, never a record error", what, err, transient)
		}
	}

	t.Run("server unreachable", func(t *testing.T) {
		b := testenv.StartPgBouncer(t, "postgres://postgres@127.0.0.1:1/gone?sslmode=disable", testenv.PgBouncerOptions{})
		_, err := pgx.Connect(ctx, b.URL()+"&connect_timeout=2")
		expect(t, "connect", err, true)
	})
	db := testenv.Postgres(t)
	t.Run("paused past query_wait_timeout", func(t *testing.T) {
		b := testenv.StartPgBouncer(t, db, testenv.PgBouncerOptions{QueryWait: time.Second})
		c := connect(t, b.URL(), "cache_describe")
		b.Admin(t, "PAUSE")
		defer b.Admin(t, "RESUME")
		_, err := c.Exec(ctx, "SELECT 1")
		expect(t, "query while paused", err, true)
	})
	t.Run("connections killed", func(t *testing.T) {
		b := testenv.StartPgBouncer(t, db, testenv.PgBouncerOptions{})
		c := connect(t, b.URL(), "cache_describe")
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		u, _ := url.Parse(db)
		b.Admin(t, "KILL "+strings.TrimPrefix(u.Path, "/"))
		defer b.Admin(t, "RESUME "+strings.TrimPrefix(u.Path, "/"))
		_, err := c.Exec(ctx, "SELECT 1")
		expect(t, "query after KILL", err, true)
	})
	t.Run("pooler restarted", func(t *testing.T) {
		b := testenv.StartPgBouncer(t, db, testenv.PgBouncerOptions{})
		c := connect(t, b.URL(), "cache_describe")
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		b.Restart(t)
		_, err := c.Exec(ctx, "SELECT 1")
		expect(t, "query after restart", err, true)
	})
	t.Run("named statements on a shared session", func(t *testing.T) {
		b := testenv.StartPgBouncer(t, db, testenv.PgBouncerOptions{PoolSize: 1})
		first := connect(t, b.URL(), "cache_statement")
		second := connect(t, b.URL(), "cache_statement")
		if _, err := first.Exec(ctx, "SELECT $1::int", 1); err != nil {
			t.Fatal(err)
		}
		_, err := second.Exec(ctx, "SELECT $1::int", 1) // same SQL, same statement name, same server session
		expect(t, "second client's prepare", err, false)
		if !store.IsPreparedStatementError(err) {
			t.Fatalf("%v: not a prepared statement error", err)
		}
		if msg := store.Explain(err).Error(); !strings.Contains(msg, "set default_query_exec_mode=cache_describe") {
			t.Errorf("Explain does not say what to change: %s", msg)
		}
	})
}
