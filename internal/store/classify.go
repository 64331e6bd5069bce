package store

import (
	"context"
	"errors"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgconn"

	"ratchet/processor"
)

// IsTransient reports whether err is likely to go away if the same batch is
// tried again later: connection loss or refusal, I/O timeouts, errors pgx
// knows happened before anything was sent, and the SQLSTATEs of classes 08
// (connection exception) and 53 (insufficient resources), admin or crash
// shutdown (57P01, 57P02, 57P03), serialization failure (40001), deadlock
// (40P01) and lock not available (55P03, a lock_timeout). An error marked processor.Permanent is never transient, whatever
// it wraps, and neither is context.Canceled: the caller stopped, and pgx
// would otherwise call a query refused for a done context safe to retry.
// A timeout (context.DeadlineExceeded, bare or inside pgx) is transient; a caller
// whose own context is done must check it before retrying. Other server
// errors are not transient.
//
// A connection pooler in front of the server reports its own failures the
// same way, and they are an outage like the server's: PgBouncer answers
// 08P01 when it cannot reach the server ("pgbouncer cannot connect to
// server", "server conn crashed?", "query_wait_timeout", "server login has
// been failing") and cuts the connection when it stops or restarts (EOF).
func IsTransient(err error) bool {
	if err == nil || processor.IsPermanent(err) || errors.Is(err, context.Canceled) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return transientSQLState(pgErr.Code)
	}
	if pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	var netErr net.Error
	return errors.As(err, &netErr)
}

func transientSQLState(code string) bool {
	switch code {
	case "57P01", "57P02", "57P03", "40001", "40P01", "55P03":
		return true
	}
	if len(code) != 5 {
		return false
	}
	switch code[:2] {
	case "08", "53":
		return true
	}
	return false
}

// IsPreparedStatementError reports whether err is the server refusing a
// named prepared statement: SQLSTATE 26000 (invalid_sql_statement_name,
// "prepared statement ... does not exist") or 42P05
// (duplicate_prepared_statement, "... already exists"). Behind a pooler
// ratchet's own queries use none (PoolerExecMode), so one reaching it means
// postgres.url asks for them (default_query_exec_mode=cache_statement) while
// a transaction-mode pooler hands each transaction another server session,
// or a pooler store.Open did not recognise (BehindPooler), or a processor
// prepares statements by name. It is a configuration
// problem: neither transient (waiting does not fix it, though a retry may
// land on a session that happens to fit) nor a record error (the data is
// not at fault: nothing may be dead-lettered for it). Explain adds what to
// change.
func IsPreparedStatementError(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return pgErr.Code == "26000" || pgErr.Code == "42P05"
}

// PreparedStatementHint says what to change when IsPreparedStatementError.
const PreparedStatementHint = "postgres.url leads to a connection pooler in transaction mode, which does not keep " +
	"prepared statements between transactions: set default_query_exec_mode=cache_describe in postgres.url " +
	"(it needs none; ratchet picks it itself behind a pooler it recognises), or run the pooler in session mode, " +
	"and prepare no statements by name in a processor"

// ConfigError is a database error caused by the configuration rather than
// by the data or an outage; its message says what to change.
type ConfigError struct {
	Err  error
	Hint string
}

func (e *ConfigError) Error() string { return e.Err.Error() + " (" + e.Hint + ")" }
func (e *ConfigError) Unwrap() error { return e.Err }

// Explain returns err as a *ConfigError carrying PreparedStatementHint when
// IsPreparedStatementError(err), and err unchanged otherwise (also when it
// is explained already).
func Explain(err error) error {
	var ce *ConfigError
	if !IsPreparedStatementError(err) || errors.As(err, &ce) {
		return err
	}
	return &ConfigError{Err: err, Hint: PreparedStatementHint}
}

// IsRecordError reports whether err is caused by the data of the batch
// rather than by the system: SQLSTATE classes 22 (data exception, e.g. a
// value out of range) and 23 (integrity constraint violation), or an error
// the processor marked with processor.Permanent, unless it is a
// configuration error (IsConfigurationError): the table's fault is never
// a record's, whatever the processor says. Retrying the same records
// cannot succeed; the caller isolates the offending ones.
func IsRecordError(err error) bool {
	if err == nil || IsConfigurationError(err) || IsPreparedStatementError(err) {
		return false
	}
	if processor.IsPermanent(err) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && len(pgErr.Code) == 5 {
		switch pgErr.Code[:2] {
		case "22", "23":
			return true
		}
	}
	return false
}

// IsConfigurationError reports whether err is PostgreSQL refusing a
// statement for what the statement or the table is, not for the values of
// the records: an error every record of every batch would meet the same
// way, so neither waiting a moment nor isolating records helps, and no
// record may be dead-lettered for it. These are SQLSTATE
//
//   - class 42, syntax error or access rule violation: raised while the
//     statement is analysed, before any row is seen (42P01 undefined
//     table, 42703 undefined column, 42804 datatype mismatch, 42P10 no
//     unique constraint matching ON CONFLICT, 42501 permission, 42883
//     undefined function, ...);
//   - class 55, object not in prerequisite state (55000: a deferrable
//     constraint as ON CONFLICT arbiter, 55006 object in use), except
//     55P03 lock not available, which is transient;
//   - 0A000 feature not supported, 3D000 / 3F000 database or schema
//     missing, class 28 invalid authorization, class 25 invalid
//     transaction state (25006: a read-only server), 2BP01 dependent
//     objects;
//   - 21000 cardinality violation (one statement touching a row twice):
//     the statement's fault, never a record's.
//
// The caller retries such a batch like an outage, for as long as it
// lasts, and says loudly what is wrong; fixing the table ends it. A
// named prepared statement refused (IsPreparedStatementError) is one too.
func IsConfigurationError(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) != 5 {
		return false
	}
	code := pgErr.Code
	switch code {
	case "55P03":
		return false
	case "0A000", "3D000", "3F000", "2BP01", "21000":
		return true
	}
	switch code[:2] {
	case "42", "55", "28", "25":
		return true
	}
	return false
}
