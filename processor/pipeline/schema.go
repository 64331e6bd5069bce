package pipeline

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/google/cel-go/cel"
	"github.com/jackc/pgx/v5"

	"ratchet/config"
)

// Querier is what Check needs; *pgxpool.Pool, *pgx.Conn and pgx.Tx
// satisfy it.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Schema is what Check learned of the pipelines' tables: their quoted
// names and the type of every column, by pipeline.
type Schema struct {
	tables map[int]*table // by pipeline index
}

type table struct {
	ident string            // quoted, schema-qualified when configured so
	types map[string]string // column (lower case) → format_type
}

// SchemaError is the database's answer to Check that the pipelines cannot
// run against: Problems holds one line per problem (a *config.Error, exit
// code 2), CreateTables a CREATE TABLE statement for each missing table
// that would satisfy its pipeline.
type SchemaError struct {
	Problems     *config.Error
	CreateTables []string
}

func (e *SchemaError) Error() string { return e.Problems.Error() }

// Unwrap returns Problems, so config.IsConfigError recognises it.
func (e *SchemaError) Unwrap() error { return e.Problems }

// quoteTable quotes a configured table name (schema.table or table) the
// way PostgreSQL folds it unquoted: in lower case.
func quoteTable(name string) string {
	parts := strings.Split(strings.ToLower(name), ".")
	return pgx.Identifier(parts).Sanitize()
}

func quoteColumn(name string) string { return pgx.Identifier{strings.ToLower(name)}.Sanitize() }

// Check compares every pipeline of s with the database q reaches: the
// table exists with every column the pipeline writes, each of a type
// that can take what its expression yields (refused only where no record
// could fit: see sinkColumn.refuses), and a unique constraint or primary
// key that ON CONFLICT can use covers exactly the upsert key, or the
// rollup's group columns and bucket column: its key columns (INCLUDE
// columns aside), not deferrable, valid, on plain columns, without a
// predicate. It
// returns what the writes need to know, or a *SchemaError with every
// problem, or the database's error.
func Check(ctx context.Context, q Querier, s *Set) (*Schema, error) {
	sc := &Schema{tables: map[int]*table{}}
	var ps []config.Problem
	var creates []string
	for _, p := range s.pipelines {
		tname, cols, unique := p.sinkShape()
		tkey := config.PipelineKey(p.index, p.sinkName(), "table")
		bad := func(key, what string) {
			ps = append(ps, config.Problem{Key: key, Reason: "pipeline " + p.name + ": " + what})
		}
		ident := quoteTable(tname)
		var oid *uint32
		if err := q.QueryRow(ctx, `SELECT to_regclass($1)::oid`, ident).Scan(&oid); err != nil {
			return nil, fmt.Errorf("pipeline %s: look up table %s: %w", p.name, tname, err)
		}
		if oid == nil {
			bad(tkey, fmt.Sprintf("table %s does not exist (ratchet pipelines check prints a CREATE TABLE for it)", tname))
			creates = append(creates, p.createTable())
			continue
		}
		t := &table{ident: ident, types: map[string]string{}}
		rows, err := q.Query(ctx, `SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped`, *oid)
		if err != nil {
			return nil, fmt.Errorf("pipeline %s: read the columns of %s: %w", p.name, tname, err)
		}
		for rows.Next() {
			var name, typ string
			if err := rows.Scan(&name, &typ); err != nil {
				rows.Close()
				return nil, fmt.Errorf("pipeline %s: read the columns of %s: %w", p.name, tname, err)
			}
			t.types[name] = typ
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("pipeline %s: read the columns of %s: %w", p.name, tname, err)
		}
		for _, c := range cols {
			typ, ok := t.types[c.name]
			switch {
			case !ok:
				bad(c.key, fmt.Sprintf("table %s has no column %s", tname, c.name))
			case c.bucket && typ != "timestamp with time zone":
				bad(c.key, fmt.Sprintf("column %s of %s is %s, not timestamptz", c.name, tname, typ))
			case c.version && !versionType(typ):
				bad(c.key, fmt.Sprintf("column %s of %s stores upsert.version and is %s, not timestamptz or a number type (bigint, integer, smallint, numeric, double precision, real)",
					c.name, tname, typ))
			default:
				if why := c.refuses(typ); why != "" {
					bad(c.key, fmt.Sprintf("column %s of %s is %s: %s", c.name, tname, typ, why))
				}
			}
		}
		if p.append != nil { // inserts only: no key to cover
			sc.tables[p.index] = t
			continue
		}
		// Only an index ON CONFLICT can use counts: unique, on plain
		// columns (no expression, no predicate), valid and ready (not a
		// failed CREATE INDEX CONCURRENTLY), not deferrable (55000), and
		// matched on its key columns alone: INCLUDE columns are not part
		// of the key (indnkeyatts).
		rows, err = q.Query(ctx, `SELECT array_agg(a.attname::text), i.indimmediate, i.indisvalid AND i.indisready
FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = $1 AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL AND k.n <= i.indnkeyatts
GROUP BY i.indexrelid, i.indimmediate, i.indisvalid, i.indisready`, *oid)
		if err != nil {
			return nil, fmt.Errorf("pipeline %s: read the unique constraints of %s: %w", p.name, tname, err)
		}
		covered := false
		var unusable []string // why an index on exactly the columns cannot serve
		for rows.Next() {
			var idx []string
			var immediate, valid bool
			if err := rows.Scan(&idx, &immediate, &valid); err != nil {
				rows.Close()
				return nil, fmt.Errorf("pipeline %s: read the unique constraints of %s: %w", p.name, tname, err)
			}
			slices.Sort(idx)
			if !slices.Equal(idx, unique) {
				continue
			}
			switch {
			case !immediate:
				unusable = append(unusable, "is DEFERRABLE, which ON CONFLICT cannot use (make it NOT DEFERRABLE)")
			case !valid:
				unusable = append(unusable, "is not valid (a CREATE INDEX CONCURRENTLY that failed: REINDEX it)")
			default:
				covered = true
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("pipeline %s: read the unique constraints of %s: %w", p.name, tname, err)
		}
		if !covered && len(unusable) > 0 {
			key := config.PipelineKey(p.index, "upsert", "key")
			if p.rollup != nil {
				key = config.PipelineKey(p.index, "rollup", "group_by")
			}
			bad(key, fmt.Sprintf("the unique index of %s on (%s) %s", tname, strings.Join(unique, ", "), unusable[0]))
			sc.tables[p.index] = t
			continue
		}
		if !covered {
			what := "upsert key"
			key := config.PipelineKey(p.index, "upsert", "key")
			if p.rollup != nil {
				what, key = "group_by columns and bucket_column", config.PipelineKey(p.index, "rollup", "group_by")
			}
			bad(key, fmt.Sprintf("no unique constraint or primary key of %s covers exactly the %s (%s); add one: ALTER TABLE %s ADD UNIQUE (%s)",
				tname, what, strings.Join(unique, ", "), tname, strings.Join(unique, ", ")))
		}
		sc.tables[p.index] = t
	}
	if len(ps) > 0 {
		return nil, &SchemaError{Problems: &config.Error{Problems: ps}, CreateTables: creates}
	}
	return sc, nil
}

// sinkColumn is one column a pipeline writes, with its key path.
type sinkColumn struct {
	name   string
	key    string
	bucket bool
	// version: the column stores upsert.version, compared with <=.
	version bool
	typ     string    // for CREATE TABLE
	out     *cel.Type // the expression's static type; nil for the bucket
	agg     string    // the aggregate that writes it, if any
}

// versionType reports whether a column of type typ (format_type's
// spelling) can store upsert.version: a time with its zone, or a number.
func versionType(typ string) bool {
	switch typ {
	case "timestamp with time zone", "bigint", "integer", "smallint", "double precision", "real", "numeric":
		return true
	}
	return strings.HasPrefix(typ, "numeric(")
}

// columnFamily sorts a column type (format_type) into what matters to
// the values ratchet sends it.
func columnFamily(typ string) string {
	base, _, _ := strings.Cut(typ, "(")
	switch strings.TrimSpace(strings.TrimSuffix(base, "[]")) {
	case "smallint", "integer", "bigint":
		return "int"
	case "real", "double precision":
		return "float"
	case "numeric":
		return "numeric"
	case "text", "character varying", "character", "name", "citext":
		return "text"
	case "boolean":
		return "bool"
	case "timestamp with time zone", "timestamp without time zone", "date":
		return "time"
	case "bytea":
		return "bytes"
	case "json", "jsonb":
		return "json"
	}
	if strings.HasSuffix(typ, "[]") {
		return "array"
	}
	return "other"
}

// refuses says why the column of type typ can never take what c's
// expression yields, or "" when it can (or only some records can tell:
// a string, or a value whose type is known per record only, is judged
// per record). An aggregate needs a number column: count and sum add to
// the stored value (COALESCE(r.c, 0) + ...), and a text column would
// order min and max as text; sum, min and max of a double need a column
// that keeps fractions.
func (c sinkColumn) refuses(typ string) string {
	fam := columnFamily(typ)
	numeric := fam == "int" || fam == "float" || fam == "numeric"
	if c.agg != "" {
		switch {
		case !numeric:
			return c.agg + " needs a number column (bigint, numeric or double precision)"
		case c.agg != aggCount && fam == "int" && c.out != nil && c.out.IsExactType(cel.DoubleType):
			return c.agg + " of a double needs a column that keeps fractions (double precision or numeric)"
		}
		return ""
	}
	if c.out == nil || fam == "other" || fam == "text" || fam == "array" {
		return ""
	}
	switch {
	case c.out.IsExactType(cel.IntType), c.out.IsExactType(cel.UintType), c.out.IsExactType(cel.DoubleType):
		if fam == "bool" || fam == "time" || fam == "bytes" {
			return "the expression yields a number (" + c.out.String() + ")"
		}
	case c.out.IsExactType(cel.BoolType):
		if fam != "bool" && fam != "json" {
			return "the expression yields a bool"
		}
	case c.out.IsExactType(cel.TimestampType):
		if fam != "time" {
			return "the expression yields a timestamp (use timestamptz)"
		}
	case c.out.IsExactType(cel.BytesType):
		if fam != "bytes" {
			return "the expression yields bytes (use bytea)"
		}
	case c.out.Kind() == cel.MapKind, c.out.Kind() == cel.ListKind:
		if fam != "json" {
			return "the expression yields a " + strings.ToLower(c.out.String()) + " (use jsonb)"
		}
	}
	return ""
}

// recordFields are the static types of record's fields: record is
// declared map(string, dyn), so CEL alone calls record.timestamp dyn.
var recordFields = map[string]*cel.Type{
	"key": cel.BytesType, "headers": cel.MapType(cel.StringType, cel.BytesType), "timestamp": cel.TimestampType,
	"topic": cel.StringType, "partition": cel.IntType, "offset": cel.IntType,
}

// staticType is e's static type, with the fields of record known.
func staticType(e *expr) *cel.Type {
	if e == nil {
		return nil
	}
	if f, ok := strings.CutPrefix(strings.TrimSpace(e.src), "record."); ok {
		if t, ok := recordFields[f]; ok {
			return t
		}
	}
	return e.out
}

func (p *pipeline) sinkName() string {
	switch {
	case p.rollup != nil:
		return "rollup"
	case p.append != nil:
		return "append"
	}
	return "upsert"
}

// sinkShape returns the table, the columns a pipeline writes, and the
// sorted columns its unique constraint must cover.
func (p *pipeline) sinkShape() (string, []sinkColumn, []string) {
	var cols []sinkColumn
	var unique []string
	if u := p.upsert; u != nil {
		for _, k := range u.key {
			cols = append(cols, sinkColumn{name: k.name, key: k.key, typ: sqlType(staticType(k)), out: staticType(k)})
			unique = append(unique, k.name)
		}
		for _, c := range u.columns {
			cols = append(cols, sinkColumn{name: c.name, key: c.key, typ: sqlType(staticType(c)), out: staticType(c)})
		}
		if v := u.version; v != nil {
			typ := sqlType(v.out)
			if typ != "bigint" && typ != "double precision" {
				typ = "timestamptz" // a timestamp, an RFC 3339 string, or known per record only
			}
			cols = append(cols, sinkColumn{name: u.versionColumn, key: u.versionKey, version: true, typ: typ})
		}
		slices.Sort(unique)
		return u.table, cols, unique
	}
	if a := p.append; a != nil {
		for _, c := range a.columns {
			cols = append(cols, sinkColumn{name: c.name, key: c.key, typ: sqlType(staticType(c)), out: staticType(c)})
		}
		return a.table, cols, nil
	}
	r := p.rollup
	for _, g := range r.groupBy {
		cols = append(cols, sinkColumn{name: g.name, key: g.key, typ: sqlType(staticType(g)), out: staticType(g)})
		unique = append(unique, g.name)
	}
	cols = append(cols, sinkColumn{name: r.bucketColumn, key: config.PipelineKey(p.index, "rollup", "bucket_column"),
		bucket: true, typ: "timestamptz"})
	unique = append(unique, r.bucketColumn)
	for _, a := range r.aggregates {
		typ := "bigint"
		if a.kind != aggCount && !staticType(a.arg).IsExactType(cel.IntType) && !staticType(a.arg).IsExactType(cel.UintType) {
			typ = "double precision"
		}
		cols = append(cols, sinkColumn{name: a.column, key: a.key, typ: typ, out: staticType(a.arg), agg: a.kind})
	}
	slices.Sort(unique)
	return r.table, cols, unique
}

// sqlType guesses a column type from an expression's static CEL type.
func sqlType(t *cel.Type) string {
	switch {
	case t == nil:
		return "text"
	case t.IsExactType(cel.StringType):
		return "text"
	case t.IsExactType(cel.IntType), t.IsExactType(cel.UintType):
		return "bigint"
	case t.IsExactType(cel.DoubleType):
		return "double precision"
	case t.IsExactType(cel.BoolType):
		return "boolean"
	case t.IsExactType(cel.BytesType):
		return "bytea"
	case t.IsExactType(cel.TimestampType):
		return "timestamptz"
	case t.IsExactType(cel.DurationType):
		return "interval"
	case t.Kind() == cel.MapKind, t.Kind() == cel.ListKind:
		return "jsonb"
	}
	return "text"
}

// createTable returns a CREATE TABLE statement that satisfies p: column
// types guessed from the expressions' static types (text where the type
// is only known per record), and the unique key as the primary key. An
// append's table needs no key: its rows are only inserted.
func (p *pipeline) createTable() string {
	tname, cols, unique := p.sinkShape()
	var b strings.Builder
	if p.append != nil {
		fmt.Fprintf(&b, "CREATE TABLE %s ( -- append: no key needed (rows are only inserted)\n", tname)
		for i, c := range cols {
			sep := ","
			if i == len(cols)-1 {
				sep = ""
			}
			fmt.Fprintf(&b, "  %s %s%s\n", c.name, c.typ, sep)
		}
		b.WriteString(");")
		return b.String()
	}
	fmt.Fprintf(&b, "CREATE TABLE %s (\n", tname)
	pk := make([]string, 0, len(cols))
	for _, c := range cols {
		notNull := ""
		if slices.Contains(unique, c.name) {
			notNull = " NOT NULL"
			pk = append(pk, c.name)
		}
		fmt.Fprintf(&b, "  %s %s%s,\n", c.name, c.typ, notNull)
	}
	fmt.Fprintf(&b, "  PRIMARY KEY (%s)\n);", strings.Join(pk, ", "))
	return b.String()
}
