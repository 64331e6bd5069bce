package pipeline

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/google/cel-go/interpreter"
	"github.com/jackc/pgx/v5"
)

// copyRows are an append's rows of one batch in COPY's text format, in
// offset order: each value as the text PostgreSQL parses as it parses a
// literal (as the upsert statements cast their text columns), so every
// column type takes what it takes in an upsert, and a value the column
// refuses is PostgreSQL's error (class 22), isolated by bisection.
type copyRows struct {
	buf []byte
	n   int
}

// add evaluates one record's columns into a row. A value ratchet cannot
// convert for its column is the record's error, naming the key path.
func (r *copyRows) add(cols []*expr, sql *statements, act interpreter.Activation, written *int) error {
	start := len(r.buf)
	for i, c := range cols {
		v, err := c.eval(act)
		if err != nil {
			r.buf = r.buf[:start]
			return err
		}
		x, err := sql.kinds[i].value(v, sql.types[i], c.bounds(act))
		if err != nil {
			r.buf = r.buf[:start]
			return fmt.Errorf("%s: %w", c.shortKey(), err)
		}
		if i > 0 {
			r.buf = append(r.buf, '\t')
		}
		r.buf = appendCopyText(r.buf, x)
	}
	r.buf = append(r.buf, '\n')
	r.n++
	*written++
	return nil
}

// appendCopyText appends a converted value (wireKind.value's: string,
// int64, float64, time.Time, bool or nil) as a field of COPY's text
// format.
func appendCopyText(b []byte, v any) []byte {
	switch x := v.(type) {
	case nil:
		return append(b, `\N`...)
	case string:
		return appendCopyEscaped(b, x)
	case int64:
		return strconv.AppendInt(b, x, 10)
	case float64:
		switch {
		case math.IsNaN(x):
			return append(b, "NaN"...)
		case math.IsInf(x, 1):
			return append(b, "Infinity"...)
		case math.IsInf(x, -1):
			return append(b, "-Infinity"...)
		}
		return strconv.AppendFloat(b, x, 'g', -1, 64)
	case bool:
		if x {
			return append(b, 't')
		}
		return append(b, 'f')
	case time.Time:
		return appendCopyTime(b, x)
	}
	return appendCopyEscaped(b, fmt.Sprint(v))
}

// appendCopyTime writes t in UTC to the microsecond, rounded down as pgx
// sends a timestamptz to an upsert; years before 1 AD as PostgreSQL
// spells them (BC).
func appendCopyTime(b []byte, t time.Time) []byte {
	t = t.UTC().Truncate(time.Microsecond)
	year, bc := t.Year(), false
	if year <= 0 {
		year, bc = 1-year, true
	}
	b = fmt.Appendf(b, "%04d-%02d-%02d %02d:%02d:%02d.%06d+00", year, int(t.Month()), t.Day(),
		t.Hour(), t.Minute(), t.Second(), t.Nanosecond()/1000)
	if bc {
		b = append(b, " BC"...)
	}
	return b
}

// appendCopyEscaped escapes what COPY's text format reads specially:
// backslash, newline, carriage return and tab.
func appendCopyEscaped(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			b = append(b, '\\', '\\')
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, c)
		}
	}
	return b
}

// copyRows writes an append's rows with one COPY on the batch's
// transaction, at once (a COPY cannot wait for the COMMIT's round trip):
// they commit or roll back with the batch and its offsets, so each
// record's row lands exactly once. The COPY needs no statement, prepared
// or described: it works behind a pooler in transaction mode. Its error
// names the pipeline and table and keeps PostgreSQL's (a refused value,
// class 22 or 23, isolated by bisection; a missing table or column, a
// configuration error).
func (p *Processor) copyRows(ctx context.Context, tx pgx.Tx, st *batchState) error {
	rows := &st.aRows
	if rows.n == 0 {
		return nil
	}
	pl := st.pl
	wrap := func(err error) error {
		return &RecordError{Pipeline: pl.name, Table: sinkTable(pl), Err: fmt.Errorf("append %d rows to %s: %w", rows.n, sinkTable(pl), err)}
	}
	conn := tx.Conn()
	if conn == nil {
		return wrap(fmt.Errorf("the batch's transaction has no connection"))
	}
	// A COPY outside the transaction would commit alone: refuse to send it
	// unless the transaction is open (a BEGIN that failed leaves it idle).
	if s := conn.PgConn().TxStatus(); s != 'T' {
		return wrap(fmt.Errorf("the batch's transaction is not open (status %q)", s))
	}
	if _, err := conn.PgConn().CopyFrom(ctx, bytes.NewReader(rows.buf), p.stmts[pl.index].copy); err != nil {
		return wrap(err)
	}
	p.counters.Rows(pl.name, "appended", rows.n)
	return nil
}
