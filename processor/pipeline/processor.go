package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/cel-go/interpreter"
	"github.com/jackc/pgx/v5"

	"ratchet/processor"
)

// Name is the processor's name in logs and metrics.
const Name = "pipelines"

// Counters receive what the pipelines did, per pipeline name. Records are
// counted once their batch's transaction was handed its writes: a batch
// that is tried again counts again (the counters are a rate, not a
// ledger). Use NopCounters to count nothing.
type Counters interface {
	// Records counts records by result: "written" (accepted by the
	// pipeline), "filtered" (where was false) or "ignored" (a tombstone the
	// pipeline does not delete on).
	Records(pipeline, result string, n int)
	// Rows counts rows sent to the table by operation: "upserted",
	// "deleted", "merged" (rollup rows) or "appended".
	Rows(pipeline, op string, n int)
}

// NopCounters counts nothing.
type NopCounters struct{}

// Records does nothing.
func (NopCounters) Records(string, string, int) {}

// Rows does nothing.
func (NopCounters) Rows(string, string, int) {}

// RecordError is a failure of one pipeline: an expression it could not
// evaluate on a record, or a statement of its rows the database refused.
// Its text starts with "pipeline NAME: ", so the dead letter of an
// isolated record names the pipeline.
type RecordError struct {
	Pipeline string
	Table    string // the pipeline's table, as configured
	Err      error
}

func (e *RecordError) Error() string { return "pipeline " + e.Pipeline + ": " + e.Err.Error() }

// Unwrap returns the cause (a PostgreSQL error keeps its SQLSTATE class).
func (e *RecordError) Unwrap() error { return e.Err }

// PipelineName returns Pipeline; the dead-letter path counts by it.
func (e *RecordError) PipelineName() string { return e.Pipeline }

// TableName returns Table; a configuration error (the table refused the
// statement whatever the records) names it.
func (e *RecordError) TableName() string { return e.Table }

// Processor applies the pipelines of a Set to batches. It is safe for
// concurrent use by several partitions.
type Processor struct {
	set      *Set
	counters Counters
	stmts    map[int]*statements // by pipeline index
	types    map[int]*table
	// origins, when set (RecordOrigins), records where each pipeline
	// began on each partition.
	origins *origins
}

// statements are one pipeline's SQL, built once, and how each of its
// columns travels (in the statement's column order).
type statements struct {
	upsert, delete string
	// older is an upsert without a version's statement for records older
	// than every row the table holds (a backfill's): it writes a row only
	// where the table has none for the key (ON CONFLICT DO NOTHING).
	older string
	copy  string // an append's COPY ... FROM STDIN
	kinds []wireKind
	types []string
}

// New returns the processor of set writing to the tables schema describes
// (from Check). counters may be nil.
func New(set *Set, schema *Schema, counters Counters) *Processor {
	if counters == nil {
		counters = NopCounters{}
	}
	p := &Processor{set: set, counters: counters, stmts: map[int]*statements{}, types: schema.tables}
	for _, pl := range set.pipelines {
		p.stmts[pl.index] = buildStatements(pl, schema.tables[pl.index])
	}
	return p
}

// Name returns "pipelines".
func (*Processor) Name() string { return Name }

// ReadsEvents returns false: pipelines read any value (processor.EventReader).
func (*Processor) ReadsEvents() bool { return false }

func typeOf(t *table, col string) string {
	if t == nil {
		return "text"
	}
	if typ, ok := t.types[col]; ok {
		return typ
	}
	return "text"
}

// buildStatements writes a pipeline's statements. Values travel as one
// array per column: of the column's own kind where it is a common one
// (text, integers, floats, timestamptz, bool), assigned as they are;
// otherwise as text cast to the column's type in the statement, which
// PostgreSQL parses as it parses a literal.
//
// The rows of one statement collapse by PostgreSQL's own equality of the
// key (DISTINCT ON the keys as the column's type, for an upsert; GROUP BY
// the group columns and bucket, for a rollup), so that keys which differ
// for ratchet but are equal for PostgreSQL never reach ON CONFLICT twice
// (SQLSTATE 21000). Ratchet already collapses keys by the column's
// equality for the types it knows (keyOf), so this only acts on the
// others (citext, interval, inet, a nondeterministic collation, ...): there the latest version (the highest version, then the
// latest offset) of a key within one rank wins, as it would applied one
// by one, but PostgreSQL judges only the winner's values.
func buildStatements(pl *pipeline, t *table) *statements {
	st := &statements{}
	ident := quoteTable(sinkTable(pl))
	if t != nil {
		ident = t.ident
	}
	var cols, sel, params, alias, dist []string
	add := func(name string) {
		i := len(cols)
		typ := typeOf(t, name)
		k := wireOf(typ)
		st.kinds, st.types = append(st.kinds, k), append(st.types, typ)
		cols = append(cols, quoteColumn(name))
		params = append(params, fmt.Sprintf("$%d::%s", i+1, k.arrayType()))
		alias = append(alias, fmt.Sprintf("c%d", i))
		switch k {
		case wireText:
			sel = append(sel, fmt.Sprintf("u.c%d::%s", i, typ))
			dist = append(dist, fmt.Sprintf("u.c%d::%s", i, equalityType(typ)))
		case wireFloat:
			sel = append(sel, fmt.Sprintf("u.c%d", i))
			dist = append(dist, fmt.Sprintf("u.c%d::%s", i, typ)) // real: as stored
		default:
			sel = append(sel, fmt.Sprintf("u.c%d", i))
			dist = append(dist, fmt.Sprintf("u.c%d", i))
		}
	}
	if a := pl.append; a != nil {
		for _, c := range a.columns {
			add(c.name)
		}
		st.copy = fmt.Sprintf("COPY %s (%s) FROM STDIN", ident, strings.Join(cols, ", "))
		return st
	}
	if u := pl.upsert; u != nil {
		for _, k := range u.key {
			add(k.name)
		}
		for _, c := range u.columns {
			add(c.name)
		}
		if u.version != nil {
			add(u.versionColumn)
		}
		nk := len(u.key)
		conflict := "DO NOTHING"
		if len(cols) > nk {
			set := make([]string, 0, len(cols)-nk)
			for _, c := range cols[nk:] {
				set = append(set, c+" = EXCLUDED."+c)
			}
			conflict = "DO UPDATE SET " + strings.Join(set, ", ")
		}
		order := strings.Join(dist[:nk], ", ")
		if u.version != nil {
			// Not older replaces: an equal version replaces too, so that
			// the later offset wins among equal versions.
			v := cols[len(cols)-1]
			conflict += fmt.Sprintf(" WHERE r.%s IS NULL OR r.%s <= EXCLUDED.%s", v, v, v)
			order += ", " + dist[len(dist)-1] + " DESC"
		}
		upsert := func(conflict string) string {
			return fmt.Sprintf("INSERT INTO %s AS r (%s) SELECT %s FROM (SELECT DISTINCT ON (%s) * FROM unnest(%s) WITH ORDINALITY AS u(%s, o) ORDER BY %s, o DESC) AS u ON CONFLICT (%s) %s",
				ident, strings.Join(cols, ", "), strings.Join(sel, ", "), strings.Join(dist[:nk], ", "),
				strings.Join(params, ", "), strings.Join(alias, ", "), order, strings.Join(cols[:nk], ", "), conflict)
		}
		st.upsert = upsert(conflict)
		if u.version == nil && !u.deleteOnNil {
			st.older = upsert("DO NOTHING")
		}
		if u.deleteOnNil {
			match := make([]string, nk)
			for i := range nk {
				match[i] = fmt.Sprintf("r.%s = %s", cols[i], sel[i])
			}
			st.delete = fmt.Sprintf("DELETE FROM %s AS r USING unnest(%s) AS u(%s) WHERE %s",
				ident, strings.Join(params[:nk], ", "), strings.Join(alias[:nk], ", "), strings.Join(match, " AND "))
		}
		return st
	}
	r := pl.rollup
	for _, g := range r.groupBy {
		add(g.name)
	}
	add(r.bucketColumn)
	ng := len(cols)
	set := make([]string, 0, len(r.aggregates))
	aggs := make([]string, 0, len(r.aggregates))
	for _, a := range r.aggregates {
		i := len(cols)
		add(a.column)
		c := quoteColumn(a.column)
		switch a.kind {
		case aggCount, aggSum:
			set = append(set, fmt.Sprintf("%s = COALESCE(r.%s, 0) + EXCLUDED.%s", c, c, c))
			aggs = append(aggs, "sum("+sel[i]+")")
		case aggMin:
			set = append(set, fmt.Sprintf("%s = LEAST(r.%s, EXCLUDED.%s)", c, c, c))
			aggs = append(aggs, "min("+sel[i]+")")
		case aggMax:
			set = append(set, fmt.Sprintf("%s = GREATEST(r.%s, EXCLUDED.%s)", c, c, c))
			aggs = append(aggs, "max("+sel[i]+")")
		}
	}
	// Groups equal for PostgreSQL but not for ratchet merge here, as they
	// would merge in the table.
	groups, gsel := make([]string, ng), slices.Clone(sel[:ng])
	for i := range ng {
		groups[i] = strconv.Itoa(i + 1)
		if st.kinds[i] == wireFloat {
			gsel[i] = dist[i] // a real column groups as real
		}
	}
	st.upsert = fmt.Sprintf("INSERT INTO %s AS r (%s) SELECT %s, %s FROM unnest(%s) AS u(%s) GROUP BY %s ORDER BY %s ON CONFLICT (%s) DO UPDATE SET %s",
		ident, strings.Join(cols, ", "), strings.Join(gsel, ", "), strings.Join(aggs, ", "), strings.Join(params, ", "),
		strings.Join(alias, ", "), strings.Join(groups, ", "), strings.Join(groups, ", "), strings.Join(cols[:ng], ", "), strings.Join(set, ", "))
	return st
}

// equalityType is the type a key column's text is cast to where rows
// collapse by PostgreSQL's equality: the column's type without a length
// for the types whose explicit cast truncates where assignment refuses
// (character(n), bit(n)), so that a value too long for the column never
// collapses with one that fits and goes unjudged.
func equalityType(typ string) string {
	switch {
	case strings.HasPrefix(typ, "character("):
		return "bpchar"
	case strings.HasPrefix(typ, "character varying("):
		return "text"
	case strings.HasPrefix(typ, "bit(") || strings.HasPrefix(typ, "bit varying("):
		return "bit varying"
	}
	return typ
}

func sinkTable(pl *pipeline) string {
	switch {
	case pl.upsert != nil:
		return pl.upsert.table
	case pl.append != nil:
		return pl.append.table
	}
	return pl.rollup.table
}

// upsertRow is one operation on one key in a batch: the rank-th of its
// key, in offset order.
type upsertRow struct {
	key    string // the key columns' values as the columns compare them, for ranking and ordering
	vals   []any  // key columns, then the other columns and the version; keys only for a delete
	delete bool
	rank   int
}

// rollupRow is one group and bucket of a batch.
type rollupRow struct {
	key    string
	group  []any
	bucket time.Time
	count  []int64 // per aggregate; count aggregates use it
	nums   []number
	set    []bool // whether nums[i] has a value yet
}

// batchState is what one pipeline collected from a batch.
type batchState struct {
	pl      *pipeline
	upserts map[string]int // operations so far per key
	uRows   []upsertRow    // in offset order
	// oRows are the rows of records older than the table's (marked by
	// HeaderBackfill) for an upsert without a version, in offset order:
	// written where the table has no row for the key (statements.older).
	oRows                      []upsertRow
	rollups                    map[string]int
	rRows                      []rollupRow
	aRows                      copyRows // an append's rows, in offset order
	written, filtered, ignored int
	// m is where the state stood before the record being collected, so
	// that a record another pipeline refuses leaves nothing here (undo).
	m stateMark
	// The aggregates of the rollup row the record merged into, before it
	// did (m.rIdx); reused from record to record.
	savedCount []int64
	savedNums  []number
	savedSet   []bool
}

// stateMark is a batchState's extent before one record.
type stateMark struct {
	uRows, oRows, rRows, aBuf  int
	aN                         int
	written, filtered, ignored int
	rIdx                       int // the existing rollup row the record merged into; -1: none
}

// mark notes where st stands before the next record.
func (st *batchState) mark() {
	st.m = stateMark{uRows: len(st.uRows), oRows: len(st.oRows), rRows: len(st.rRows), aBuf: len(st.aRows.buf), aN: st.aRows.n,
		written: st.written, filtered: st.filtered, ignored: st.ignored, rIdx: -1}
}

// saveRow keeps the aggregates of rollup row idx before a record merges
// into it, for undo.
func (st *batchState) saveRow(idx int) {
	row := &st.rRows[idx]
	st.m.rIdx = idx
	st.savedCount = append(st.savedCount[:0], row.count...)
	st.savedNums = append(st.savedNums[:0], row.nums...)
	st.savedSet = append(st.savedSet[:0], row.set...)
}

// undo takes out of st everything the record since mark gave it: the
// record was refused by a pipeline of its topic, so by all of them.
func (st *batchState) undo() {
	m := st.m
	for k := len(st.uRows) - 1; k >= m.uRows; k-- {
		key := st.uRows[k].key
		if st.upserts[key]--; st.upserts[key] <= 0 {
			delete(st.upserts, key)
		}
	}
	st.uRows = st.uRows[:m.uRows]
	st.oRows = st.oRows[:m.oRows]
	for k := len(st.rRows) - 1; k >= m.rRows; k-- {
		delete(st.rollups, st.rRows[k].key)
	}
	st.rRows = st.rRows[:m.rRows]
	if m.rIdx >= 0 {
		row := &st.rRows[m.rIdx]
		copy(row.count, st.savedCount)
		copy(row.nums, st.savedNums)
		copy(row.set, st.savedSet)
	}
	st.aRows.buf = st.aRows.buf[:m.aBuf]
	st.aRows.n = m.aN
	st.written, st.filtered, st.ignored = m.written, m.filtered, m.ignored
	st.m.rIdx = -1
}

// Process evaluates every pipeline of b's topic on each record, in offset
// order, and writes each pipeline's rows in one statement. A record that
// a pipeline cannot evaluate is refused with a processor.Permanent error
// naming the pipeline, the record and the key path of the expression:
// taken out of the batch with processor.Reject when the transaction takes
// it (then no pipeline of the topic writes anything of it, and the batch
// goes on), otherwise the batch fails with that error and the engine
// isolates the record by splitting the batch. Either way the record's
// dead letter is the same: the first pipeline, in the configuration's
// order, that refuses it names it.
func (p *Processor) Process(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
	pls := p.set.byTopic[b.Topic]
	if len(pls) == 0 || len(b.Records) == 0 {
		return nil
	}
	states := make([]*batchState, len(pls))
	for i, pl := range pls {
		st := &batchState{pl: pl, rollups: map[string]int{}}
		if pl.upsert != nil {
			// A row per record at most: sized once, not grown by doubling
			// through a batch of thousands.
			st.upserts, st.uRows = make(map[string]int, len(b.Records)), make([]upsertRow, 0, len(b.Records))
		} else {
			st.upserts = map[string]int{}
		}
		if pl.append != nil {
			st.aRows.take()
		}
		states[i] = st
	}
	// The COPY has run (or will not) when Process returns, on every path.
	defer func() {
		for _, st := range states {
			if st.pl.append != nil {
				st.aRows.release()
			}
		}
	}()
	format := p.set.formats[b.Topic]
	act := &recordActivation{} // each record's in turn
	for i := range b.Records {
		rec := &b.Records[i]
		act.reset(ctx, rec, format, p.set.adapter)
		// A replayed dead letter of a backfill is for its pipeline only:
		// the others are marked (undo of theirs is then a no-op) and skip it.
		only, marked := backfillOf(rec.Headers)
		for j, st := range states {
			st.mark()
			if marked && st.pl.name != only {
				continue
			}
			if err := p.collect(st, rec, act, marked); err != nil {
				if errors.Is(err, ErrInterrupted) {
					return fmt.Errorf("pipeline %s: %w", st.pl.name, err) // a stop, not the record's fault: the batch is retried
				}
				refused := processor.Permanent(&RecordError{Pipeline: st.pl.name, Table: sinkTable(st.pl),
					Err: fmt.Errorf("record %s[%d]@%d: %w", rec.Topic, rec.Partition, rec.Offset, err)})
				if !processor.Reject(tx, rec.Offset, refused) {
					return refused
				}
				// Refused by one pipeline, the record is refused by all
				// of its topic: the ones before keep nothing of it.
				for _, prev := range states[:j+1] {
					prev.undo()
				}
				break
			}
		}
	}
	// The first batch a pipeline applies live on a partition records its
	// origin there, in this transaction: committed with its rows or not
	// at all.
	if p.origins != nil {
		if err := p.origins.record(ctx, tx, b.Topic, b.Partition, b.Start, pls); err != nil {
			return err
		}
	}
	// Alone in its batch, a record is being isolated: run its statements at
	// once, so that a value PostgreSQL refuses fails with the pipeline's
	// name. Otherwise every write goes with the COMMIT's round trip.
	now := len(b.Records) == 1
	for _, st := range states {
		if err := p.write(ctx, tx, st, now); err != nil {
			return err
		}
	}
	for _, st := range states {
		name := st.pl.name
		p.counters.Records(name, "written", st.written)
		p.counters.Records(name, "filtered", st.filtered)
		p.counters.Records(name, "ignored", st.ignored)
	}
	return nil
}

// collect evaluates one pipeline on one record. older marks a record
// older than every row its pipeline's table holds (a backfill's).
func (p *Processor) collect(st *batchState, rec *processor.Record, act interpreter.Activation, older bool) error {
	pl := st.pl
	sql := p.stmts[pl.index]
	if rec.Value == nil { // a tombstone skips where
		u := pl.upsert
		if u == nil || !u.deleteOnNil {
			st.ignored++
			return nil
		}
		vals, key, err := evalColumns(u.key, sql, 0, act, nil)
		if err != nil {
			return err
		}
		st.putUpsert(upsertRow{key: key, vals: vals, delete: true})
		st.written++
		return nil
	}
	if pl.where != nil {
		ok, err := pl.where.whereHolds(act)
		if err != nil {
			return err
		}
		if !ok {
			st.filtered++
			return nil
		}
	}
	if a := pl.append; a != nil {
		return st.aRows.add(a.columns, sql, act, &st.written)
	}
	if u := pl.upsert; u != nil {
		vals, key, err := evalColumns(u.key, sql, 0, act, make([]any, 0, len(u.key)+len(u.columns)))
		if err != nil {
			return err
		}
		for i, k := range vals {
			if k == nil {
				return fmt.Errorf("%s: null (a key column cannot be null)", u.key[i].shortKey())
			}
		}
		vals, _, err = appendColumns(u.columns, sql, len(u.key), act, vals, nil, false)
		if err != nil {
			return err
		}
		if u.version != nil {
			v, err := versionValue(u.version, sql, len(vals), act)
			if err != nil {
				return err
			}
			vals = append(vals, v)
		}
		if older && sql.older != "" {
			st.oRows = append(st.oRows, upsertRow{key: key, vals: vals})
		} else {
			st.putUpsert(upsertRow{key: key, vals: vals})
		}
		st.written++
		return nil
	}
	r := pl.rollup
	t, err := r.time.timeOf(act)
	if err != nil {
		return err
	}
	// The group's values and key are built on the stack: a record whose
	// group and bucket the batch has already met allocates neither.
	var groupBuf [4]any
	var keyBuf [128]byte
	group, kb, err := appendColumns(r.groupBy, sql, 0, act, groupBuf[:0], keyBuf[:0], true)
	if err != nil {
		return err
	}
	bucket := bucketStart(t, r.bucket)
	kb = strconv.AppendInt(kb, bucket.Unix(), 10)
	var nums [8]number // the aggregates' operands; more than 8 spill
	ops := nums[:0]
	// Aggregates of one expression (sum, min and max of one value) share
	// its evaluation.
	var done [8]*expr
	for i, a := range r.aggregates {
		ops = append(ops, number{})
		if a.kind == aggCount {
			continue
		}
		if j := slices.IndexFunc(done[:min(i, len(done))], func(e *expr) bool { return e != nil && e.src == a.arg.src }); j >= 0 {
			ops[i] = ops[j]
			continue
		}
		v, err := a.arg.eval(act)
		if err != nil {
			return err
		}
		n, err := toNumber(v)
		if err != nil {
			return fmt.Errorf("%s: %w", a.arg.shortKey(), err)
		}
		if n.isFloat && (math.IsNaN(n.f) || math.IsInf(n.f, 0)) {
			return fmt.Errorf("%s: %v is not a finite number", a.arg.shortKey(), n.f)
		}
		ops[i] = n
		if i < len(done) {
			done[i] = a.arg
		}
	}
	idx, ok := st.rollups[string(kb)]
	if !ok {
		key := string(kb)
		idx = len(st.rRows)
		st.rollups[key] = idx
		st.rRows = append(st.rRows, rollupRow{key: key, group: slices.Clone(group), bucket: bucket,
			count: make([]int64, len(r.aggregates)), nums: make([]number, len(r.aggregates)), set: make([]bool, len(r.aggregates))})
	}
	row := &st.rRows[idx]
	if ok {
		st.saveRow(idx)
	}
	for i, a := range r.aggregates {
		switch {
		case a.kind == aggCount:
			row.count[i]++
		case !row.set[i]:
			row.nums[i], row.set[i] = ops[i], true
		case a.kind == aggSum:
			row.nums[i] = row.nums[i].add(ops[i])
		case a.kind == aggMin && ops[i].less(row.nums[i]):
			row.nums[i] = ops[i]
		case a.kind == aggMax && row.nums[i].less(ops[i]):
			row.nums[i] = ops[i]
		}
	}
	st.written++
	return nil
}

// splitDeletes parts one rank's rows into upserts and deletes, each in
// offset order. A rank without deletes (most) is its own upserts, not a
// copy of them.
func splitDeletes(rows []upsertRow) (ups, dels []upsertRow) {
	nd := 0
	for i := range rows {
		if rows[i].delete {
			nd++
		}
	}
	if nd == 0 {
		return rows, nil
	}
	ups, dels = make([]upsertRow, 0, len(rows)-nd), make([]upsertRow, 0, nd)
	for _, r := range rows {
		if r.delete {
			dels = append(dels, r)
		} else {
			ups = append(ups, r)
		}
	}
	return ups, dels
}

// putUpsert adds the next operation of its key. Every operation is kept,
// not only the last of each key: each is written in turn (see write), so
// PostgreSQL judges every version, whatever the batch.
func (st *batchState) putUpsert(r upsertRow) {
	st.upserts[r.key]++
	r.rank = st.upserts[r.key]
	st.uRows = append(st.uRows, r)
}

// versionValue evaluates upsert.version for its column (the statement's
// column i): a time as toTime reads it for a timestamptz column, a finite
// number for a number column. Anything else,
// null included, is the record's error.
func versionValue(e *expr, sql *statements, i int, act interpreter.Activation) (any, error) {
	v, err := e.eval(act)
	if err != nil {
		return nil, err
	}
	k, typ := sql.kinds[i], sql.types[i]
	if k == wireTime {
		t, err := toTime(v, e.bounds(act))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", e.shortKey(), err)
		}
		return t, nil
	}
	n, err := toNumber(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %s is not a version for a %s column (a number)", e.shortKey(), show(v), typ)
	}
	if n.isFloat && (math.IsNaN(n.f) || math.IsInf(n.f, 0)) {
		return nil, fmt.Errorf("%s: %v is not a finite number", e.shortKey(), n.f)
	}
	x, err := k.value(v, typ, e.bounds(act))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", e.shortKey(), err)
	}
	return x, nil
}

// evalColumns evaluates cols, the statement's columns from first on, into
// values of their columns' kinds appended to out, and a key joining them.
func evalColumns(cols []*expr, sql *statements, first int, act interpreter.Activation, out []any) ([]any, string, error) {
	var buf [128]byte
	out, key, err := appendColumns(cols, sql, first, act, out, buf[:0], true)
	if err != nil {
		return nil, "", err
	}
	return out, string(key), nil
}

// appendColumns is evalColumns appending the key's bytes to key (when
// keyed) instead of making a string of them, so that a caller that only
// looks the key up, or needs no key, allocates none.
func appendColumns(cols []*expr, sql *statements, first int, act interpreter.Activation, out []any, key []byte, keyed bool) ([]any, []byte, error) {
	for i, c := range cols {
		k, typ := sql.kinds[first+i], sql.types[first+i]
		x, ok := c.native(act, k)
		if !ok {
			v, err := c.eval(act)
			if err != nil {
				return nil, nil, err
			}
			if x, err = k.value(v, typ, c.bounds(act)); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", c.shortKey(), err)
			}
		}
		out = append(out, x)
		if keyed {
			key = keyOf(key, x, k, typ)
		}
	}
	return out, key, nil
}

// writeOlder sends the rows of records older than the table's (st.oRows)
// before the batch's other rows, each only where the table has no row for
// its key: the newest of a key first, rank by rank (rank 1 is each key's
// newest record in the batch), so that an older record of a key never
// replaces a newer one, and every record still reaches PostgreSQL, judged
// whatever the batch's boundaries. Within a rank the rows stay in offset
// order (the statement's ordinal picks the newest of keys equal for
// PostgreSQL).
func (p *Processor) writeOlder(st *batchState, exec func(what, stmt string, n int, args []any) error) error {
	if len(st.oRows) == 0 {
		return nil
	}
	sql := p.stmts[st.pl.index]
	seen := make(map[string]int, len(st.oRows))
	for i := len(st.oRows) - 1; i >= 0; i-- {
		r := &st.oRows[i]
		seen[r.key]++
		r.rank = seen[r.key]
	}
	slices.SortStableFunc(st.oRows, func(a, b upsertRow) int { return cmp.Compare(a.rank, b.rank) })
	for rows := st.oRows; len(rows) > 0; {
		n := 1
		for n < len(rows) && rows[n].rank == rows[0].rank {
			n++
		}
		if err := exec("upsert", sql.older, n, columnsOf(rows[:n], sql.kinds)); err != nil {
			return err
		}
		p.counters.Rows(st.pl.name, "upserted", n)
		rows = rows[n:]
	}
	return nil
}

// write sends one pipeline's rows. Each statement's rows are in key order
// (upserts and rollups sort them in the statement), so transactions of
// different partitions lock shared rows in the same order and cannot
// deadlock each other.
func (p *Processor) write(ctx context.Context, tx pgx.Tx, st *batchState, now bool) error {
	pl, sql := st.pl, p.stmts[st.pl.index]
	exec := func(what, stmt string, n int, args []any) error {
		// The error names the pipeline and its table also when the
		// COMMIT's round trip reports it.
		wrap := func(err error) error {
			return &RecordError{Pipeline: pl.name, Table: sinkTable(pl), Err: fmt.Errorf("%s %d rows of %s: %w", what, n, sinkTable(pl), err)}
		}
		if now {
			if _, err := tx.Exec(ctx, stmt, args...); err != nil {
				return wrap(err)
			}
			return nil
		}
		return processor.ExecLastWrapped(ctx, tx, wrap, stmt, args...)
	}
	if pl.append != nil {
		return p.copyRows(ctx, tx, st)
	}
	if pl.upsert != nil {
		if err := p.writeOlder(st, exec); err != nil {
			return err
		}
		// Rank by rank: rank 1 is each key's first operation in the batch,
		// rank 2 each key's second, and so on; each rank is one delete and
		// one upsert statement over distinct keys, in rank order. Every
		// version of a key thus reaches PostgreSQL in offset order, judged
		// as if the records were applied one by one, so the records it
		// refuses are the same whatever the batch.
		// Within a rank the rows stay in offset order: the statement's
		// ordinal breaks ties between keys equal for PostgreSQL, and it
		// sorts the rows by key itself (the lock order).
		slices.SortStableFunc(st.uRows, func(a, b upsertRow) int { return cmp.Compare(a.rank, b.rank) })
		for rows := st.uRows; len(rows) > 0; {
			n := 1
			for n < len(rows) && rows[n].rank == rows[0].rank {
				n++
			}
			ups, dels := splitDeletes(rows[:n])
			rows = rows[n:]
			slices.SortFunc(dels, func(a, b upsertRow) int { return cmp.Compare(a.key, b.key) })
			if len(dels) > 0 {
				if err := exec("delete", sql.delete, len(dels), columnsOf(dels, sql.kinds[:len(pl.upsert.key)])); err != nil {
					return err
				}
				p.counters.Rows(pl.name, "deleted", len(dels))
			}
			if len(ups) > 0 {
				if err := exec("upsert", sql.upsert, len(ups), columnsOf(ups, sql.kinds)); err != nil {
					return err
				}
				p.counters.Rows(pl.name, "upserted", len(ups))
			}
		}
		return nil
	}
	if len(st.rRows) == 0 {
		return nil
	}
	slices.SortFunc(st.rRows, func(a, b rollupRow) int { return cmp.Compare(a.key, b.key) })
	r := pl.rollup
	ng, n := len(r.groupBy), len(st.rRows)
	args := make([]any, 0, ng+1+len(r.aggregates))
	for i := range ng {
		args = append(args, column(sql.kinds[i], n, func(j int) any { return st.rRows[j].group[i] }))
	}
	args = append(args, column(sql.kinds[ng], n, func(j int) any { return st.rRows[j].bucket }))
	for i, a := range r.aggregates {
		k, typ := sql.kinds[ng+1+i], sql.types[ng+1+i]
		vals := make([]any, n)
		for j, row := range st.rRows {
			num := row.nums[i]
			if a.kind == aggCount {
				num = number{i: row.count[i]}
			}
			v, err := k.numberValue(num, typ)
			if err != nil {
				return processor.Permanent(&RecordError{Pipeline: pl.name, Table: sinkTable(pl), Err: fmt.Errorf("%s: %w", shortKey(a.key), err)})
			}
			vals[j] = v
		}
		args = append(args, column(k, n, func(j int) any { return vals[j] }))
	}
	if err := exec("merge", sql.upsert, n, args); err != nil {
		return err
	}
	p.counters.Rows(pl.name, "merged", n)
	return nil
}

// columnsOf turns rows into one array per column of kinds.
func columnsOf(rows []upsertRow, kinds []wireKind) []any {
	args := make([]any, len(kinds))
	for i, k := range kinds {
		args[i] = column(k, len(rows), func(j int) any { return rows[j].vals[i] })
	}
	return args
}
