package pipeline

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
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
	// lent: a COPY read buf and failed. pgconn may return from a failed
	// COPY before its sending goroutine has stopped reading, so buf is
	// never pooled again.
	lent bool
}

// copyBufs keep append buffers from batch to batch: grown by doubling
// from empty, a batch's COPY text was copied over again and again on its
// way to the batch's size, and its arrays left for the collector.
var copyBufs = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledCopy is the largest buffer kept for the next batch; a larger
// one (a batch of wide rows) goes to the collector.
const maxPooledCopy = 4 << 20

// take starts r on a pooled buffer.
func (r *copyRows) take() {
	r.buf, r.n = (*copyBufs.Get().(*[]byte))[:0], 0
}

// release gives r's buffer back once the batch is written or given up,
// unless a failed COPY may still be reading it.
func (r *copyRows) release() {
	if r.buf != nil && !r.lent && cap(r.buf) <= maxPooledCopy {
		b := r.buf[:0]
		copyBufs.Put(&b)
	}
	r.buf, r.n, r.lent = nil, 0, false
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
// spells them (BC). It is on the path of every time an append writes, so
// it formats by hand (fmt.Appendf took a tenth of an append drain's CPU).
func appendCopyTime(b []byte, t time.Time) []byte {
	t = t.UTC().Truncate(time.Microsecond)
	year, month, day := t.Date()
	hour, minute, sec := t.Clock()
	bc := year <= 0
	if bc {
		year = 1 - year
	}
	b = appendZeroPadded(b, year, 4)
	b = append(b, '-')
	b = appendZeroPadded(b, int(month), 2)
	b = append(b, '-')
	b = appendZeroPadded(b, day, 2)
	b = append(b, ' ')
	b = appendZeroPadded(b, hour, 2)
	b = append(b, ':')
	b = appendZeroPadded(b, minute, 2)
	b = append(b, ':')
	b = appendZeroPadded(b, sec, 2)
	b = append(b, '.')
	b = appendZeroPadded(b, t.Nanosecond()/1000, 6)
	b = append(b, "+00"...)
	if bc {
		b = append(b, " BC"...)
	}
	return b
}

// appendZeroPadded appends v (≥ 0) in decimal, with leading zeros to at
// least width digits, as fmt's %0*d.
func appendZeroPadded(b []byte, v, width int) []byte {
	var d [24]byte
	i := len(d)
	for v >= 10 {
		i--
		d[i] = byte('0' + v%10)
		v /= 10
	}
	i--
	d[i] = byte('0' + v)
	for len(d)-i < width && i > 0 {
		i--
		d[i] = '0'
	}
	return append(b, d[i:]...)
}

// appendCopyEscaped escapes what COPY's text format reads specially:
// backslash, newline, carriage return and tab. Runs without them are
// copied whole. The scan is by hand: strings.IndexAny builds its byte set
// on every call, and took the bench's row from 129 to 168 ns.
func appendCopyEscaped(b []byte, s string) []byte {
	for {
		i := 0
		for i < len(s) && s[i] != '\\' && s[i] != '\n' && s[i] != '\r' && s[i] != '\t' {
			i++
		}
		b = append(b, s[:i]...)
		if i == len(s) {
			return b
		}
		switch s[i] {
		case '\\':
			b = append(b, '\\', '\\')
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		}
		s = s[i+1:]
	}
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
	rows.lent = true
	if _, err := conn.PgConn().CopyFrom(ctx, bytes.NewReader(rows.buf), p.stmts[pl.index].copy); err != nil {
		return wrap(err)
	}
	rows.lent = false // CopyFrom waited for its reader: the COPY completed
	p.counters.Rows(pl.name, "appended", rows.n)
	return nil
}
