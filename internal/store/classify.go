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
// shutdown (57P01, 57P02, 57P03), serialization failure (40001) and deadlock
// (40P01). An error marked processor.Permanent is never transient, whatever
// it wraps, and neither is context.Canceled: the caller stopped, and pgx
// would otherwise call a query refused for a done context safe to retry.
// A timeout (context.DeadlineExceeded, bare or inside pgx) is transient; a caller
// whose own context is done must check it before retrying. Other server
// errors are not transient.
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
	case "57P01", "57P02", "57P03", "40001", "40P01":
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

// IsRecordError reports whether err is caused by the data of the batch
// rather than by the system: SQLSTATE classes 22 (data exception, e.g. a
// value out of range) and 23 (integrity constraint violation), or an error
// the processor marked with processor.Permanent. Retrying the same records
// cannot succeed; the caller isolates the offending ones.
func IsRecordError(err error) bool {
	if err == nil {
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
