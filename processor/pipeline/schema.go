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
// table exists with every column the pipeline writes, and a unique
// constraint or primary key covers exactly the upsert key, or the
// rollup's group columns and bucket column (what ON CONFLICT needs). It
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
			}
		}
		rows, err = q.Query(ctx, `SELECT array_agg(a.attname::text) FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = $1 AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL
GROUP BY i.indexrelid`, *oid)
		if err != nil {
			return nil, fmt.Errorf("pipeline %s: read the unique constraints of %s: %w", p.name, tname, err)
		}
		covered := false
		for rows.Next() {
			var idx []string
			if err := rows.Scan(&idx); err != nil {
				rows.Close()
				return nil, fmt.Errorf("pipeline %s: read the unique constraints of %s: %w", p.name, tname, err)
			}
			slices.Sort(idx)
			covered = covered || slices.Equal(idx, unique)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("pipeline %s: read the unique constraints of %s: %w", p.name, tname, err)
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
	typ     string // for CREATE TABLE
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

func (p *pipeline) sinkName() string {
	if p.rollup != nil {
		return "rollup"
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
			cols = append(cols, sinkColumn{name: k.name, key: k.key, typ: sqlType(k.out)})
			unique = append(unique, k.name)
		}
		for _, c := range u.columns {
			cols = append(cols, sinkColumn{name: c.name, key: c.key, typ: sqlType(c.out)})
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
	r := p.rollup
	for _, g := range r.groupBy {
		cols = append(cols, sinkColumn{name: g.name, key: g.key, typ: sqlType(g.out)})
		unique = append(unique, g.name)
	}
	cols = append(cols, sinkColumn{name: r.bucketColumn, key: config.PipelineKey(p.index, "rollup", "bucket_column"),
		bucket: true, typ: "timestamptz"})
	unique = append(unique, r.bucketColumn)
	for _, a := range r.aggregates {
		typ := "bigint"
		if a.kind != aggCount && !a.arg.out.IsExactType(cel.IntType) && !a.arg.out.IsExactType(cel.UintType) {
			typ = "double precision"
		}
		cols = append(cols, sinkColumn{name: a.column, key: a.key, typ: typ})
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
// is only known per record), and the unique key as the primary key.
func (p *pipeline) createTable() string {
	tname, cols, unique := p.sinkShape()
	var b strings.Builder
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
