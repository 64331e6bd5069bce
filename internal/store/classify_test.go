package store_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"ratchet/internal/store"
	"ratchet/processor"
)

func TestClassify(t *testing.T) {
	pg := func(code string) error { return &pgconn.PgError{Code: code, Message: "x"} }
	tests := []struct {
		name      string
		err       error
		transient bool
		record    bool
	}{
		{"nil", nil, false, false},
		{"plain", errors.New("x"), false, false},
		{"canceled", context.Canceled, false, false},
		{"deadline exceeded", context.DeadlineExceeded, true, false},
		{"eof", io.EOF, true, false},
		{"unexpected eof wrapped", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true, false},
		{"net op error", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true, false},
		{"connection exception 08006", pg("08006"), true, false},
		{"connection exception 08001 wrapped", fmt.Errorf("apply: %w", pg("08001")), true, false},
		{"too many connections 53300", pg("53300"), true, false},
		{"disk full 53100", pg("53100"), true, false},
		{"admin shutdown 57P01", pg("57P01"), true, false},
		{"crash shutdown 57P02", pg("57P02"), true, false},
		{"cannot connect now 57P03", pg("57P03"), true, false},
		{"query canceled 57014", pg("57014"), false, false},
		{"serialization failure 40001", pg("40001"), true, false},
		{"deadlock 40P01", pg("40P01"), true, false},
		{"transaction rollback 40000", pg("40000"), false, false},
		{"division by zero 22012", pg("22012"), false, true},
		{"numeric out of range 22003", pg("22003"), false, true},
		{"unique violation 23505", pg("23505"), false, true},
		{"not null 23502 wrapped", fmt.Errorf("x: %w", pg("23502")), false, true},
		{"undefined table 42P01", pg("42P01"), false, false},
		{"permanent", processor.Permanent(errors.New("bad event")), false, true},
		{"permanent wrapping a deadlock", processor.Permanent(pg("40P01")), false, true},
		{"permanent wrapping eof", fmt.Errorf("x: %w", processor.Permanent(io.EOF)), false, true},
		{"tx closed", pgx.ErrTxClosed, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := store.IsTransient(tt.err); got != tt.transient {
				t.Errorf("IsTransient(%v) = %v, want %v", tt.err, got, tt.transient)
			}
			if got := store.IsRecordError(tt.err); got != tt.record {
				t.Errorf("IsRecordError(%v) = %v, want %v", tt.err, got, tt.record)
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
	t.Run("constraint", func(t *testing.T) {
		_, err := pool.Exec(ctx, "INSERT INTO ratchet_offsets (consumer_group, topic, partition, next_offset, epoch, owner) VALUES ('g', 't', 0, -1, 1, 'a')")
		if err == nil || store.IsTransient(err) || !store.IsRecordError(err) {
			t.Fatalf("check violation: %v; want record error", err)
		}
	})
}
