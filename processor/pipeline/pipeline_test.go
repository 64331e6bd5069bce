package pipeline_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/config"
	"ratchet/internal/store"
	"ratchet/internal/testenv"
	"ratchet/processor"
	"ratchet/processor/pipeline"
)

// ordersYAML is the example: an upsert and a rollup of one topic.
const ordersYAML = `
kafka:
  topics: [orders]
pipelines:
  - name: orders
    topic: orders
    format: json
    where: value.status != "test"
    upsert:
      table: orders
      key:     { order_id: string(record.key) }
      columns: { customer: value.customer.id, amount: double(value.amount), updated_at: record.timestamp }
      on_tombstone: delete
  - name: revenue_per_minute
    topic: orders
    format: json
    rollup:
      table: revenue_per_minute
      time: value.ts
      bucket: 1m
      bucket_column: minute
      group_by: { country: value.customer.country }
      aggregates: { orders: count, revenue: sum(double(value.amount)), biggest: max(double(value.amount)), smallest: min(double(value.amount)) }
`

const ordersTables = `
CREATE TABLE orders (order_id text PRIMARY KEY, customer text, amount numeric(12,2), updated_at timestamptz);
CREATE TABLE revenue_per_minute (country text NOT NULL, minute timestamptz NOT NULL, orders bigint, revenue double precision,
  biggest double precision, smallest double precision, PRIMARY KEY (country, minute));
`

// loadConfig loads yaml as a configuration file.
func loadConfig(tb testing.TB, yaml string) (config.Config, error) {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "ratchet.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		tb.Fatal(err)
	}
	return config.Load(path, nil)
}

// setup creates the tables in a fresh database and returns a pool and the
// processor of yaml's pipelines.
func setup(tb testing.TB, yaml, tables string) (*pgxpool.Pool, *pipeline.Processor) {
	tb.Helper()
	cfg, err := loadConfig(tb, yaml)
	if err != nil {
		tb.Fatalf("load: %v", err)
	}
	set, err := pipeline.Compile(cfg)
	if err != nil {
		tb.Fatalf("compile: %v", err)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.Postgres(tb))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, tables); err != nil {
		tb.Fatalf("create tables: %v", err)
	}
	schema, err := pipeline.Check(ctx, pool, set)
	if err != nil {
		tb.Fatalf("check: %v", err)
	}
	return pool, pipeline.New(set, schema, nil)
}

// rec makes a record of topic orders at offset off; a nil value is a
// tombstone.
func rec(tb testing.TB, off int64, key, value string) processor.Record {
	tb.Helper()
	r := processor.Record{Topic: "orders", Offset: off, Key: []byte(key),
		Timestamp: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC).Add(time.Duration(off) * time.Second)}
	if value != "" {
		r.Value = []byte(value)
		if err := (pipeline.JSONDecoder{}).DecodeRecord(&r); err != nil {
			tb.Fatalf("decode %s: %v", value, err)
		}
	}
	return r
}

// apply runs one batch in a transaction, committed when Process succeeds.
func apply(tb testing.TB, pool *pgxpool.Pool, p *pipeline.Processor, recs ...processor.Record) error {
	tb.Helper()
	b := processor.Batch{Topic: "orders", Start: recs[0].Offset, Next: recs[len(recs)-1].Offset + 1, Records: recs}
	return pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		return p.Process(context.Background(), tx, b)
	})
}

func order(id, status, customer, country string, amount string, ts string) string {
	return `{"id":"` + id + `","status":"` + status + `","amount":` + amount + `,"ts":"` + ts +
		`","customer":{"id":"` + customer + `","country":"` + country + `"}}`
}

func query(tb testing.TB, pool *pgxpool.Pool, sql string) []string {
	tb.Helper()
	rows, err := pool.Query(context.Background(), sql)
	if err != nil {
		tb.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

func assertRows(tb testing.TB, pool *pgxpool.Pool, sql string, want ...string) {
	tb.Helper()
	got := query(tb, pool, sql)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		tb.Fatalf("%s:\ngot\n  %s\nwant\n  %s", sql, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

const (
	ordersRows  = `SELECT order_id||' '||customer||' '||amount FROM orders ORDER BY order_id`
	revenueRows = `SELECT country||' '||to_char(minute AT TIME ZONE 'UTC','HH24:MI')||' '||orders||' '||revenue||' '||biggest||' '||smallest FROM revenue_per_minute ORDER BY country, minute`
)

func TestUpsertAndRollupFromOneTopic(t *testing.T) {
	pool, p := setup(t, ordersYAML, ordersTables)
	err := apply(t, pool, p,
		rec(t, 0, "o1", order("o1", "new", "c1", "fr", "10.5", "2026-12-01T09:00:10Z")),
		rec(t, 1, "o2", order("o2", "new", "c2", "de", "7", "2026-12-01T09:00:20Z")),
		rec(t, 2, "o1", order("o1", "paid", "c1", "fr", "12", "2026-12-01T09:00:50Z")), // same key: the last wins
		rec(t, 3, "o3", order("o3", "test", "c3", "fr", "99", "2026-12-01T09:00:55Z")), // filtered by where in orders only
		rec(t, 4, "o4", order("o4", "new", "c4", "fr", "1", "2026-12-01T09:01:05Z")),
	)
	if err != nil {
		t.Fatal(err)
	}
	assertRows(t, pool, ordersRows, "o1 c1 12.00", "o2 c2 7.00", "o4 c4 1.00")
	assertRows(t, pool, revenueRows, "de 09:00 1 7 7 7", "fr 09:00 3 121.5 99 10.5", "fr 09:01 1 1 1 1")

	// A second batch merges into the rollups (counts and sums add, min and
	// max combine) and a tombstone deletes its key; the rollup ignores it.
	err = apply(t, pool, p,
		rec(t, 5, "o2", ""),
		rec(t, 6, "o5", order("o5", "new", "c5", "fr", "0.5", "2026-12-01T09:00:30Z")),
		rec(t, 7, "o6", order("o6", "new", "c6", "de", "3", "2026-12-01T09:00:01Z")),
		rec(t, 8, "o6", ""), // upserted then deleted in one batch: deleted
	)
	if err != nil {
		t.Fatal(err)
	}
	assertRows(t, pool, ordersRows, "o1 c1 12.00", "o4 c4 1.00", "o5 c5 0.50")
	assertRows(t, pool, revenueRows, "de 09:00 2 10 7 3", "fr 09:00 4 122 99 0.5", "fr 09:01 1 1 1 1")
}

func TestTombstoneThenUpsertInOneBatchKeepsTheRow(t *testing.T) {
	pool, p := setup(t, ordersYAML, ordersTables)
	if err := apply(t, pool, p, rec(t, 0, "o1", order("o1", "new", "c1", "fr", "1", "2026-12-01T09:00:10Z"))); err != nil {
		t.Fatal(err)
	}
	if err := apply(t, pool, p, rec(t, 1, "o1", ""), rec(t, 2, "o1", order("o1", "new", "c9", "fr", "2", "2026-12-01T09:00:10Z"))); err != nil {
		t.Fatal(err)
	}
	assertRows(t, pool, ordersRows, "o1 c9 2.00")
}

// A record one pipeline cannot evaluate fails the batch as a record error
// naming that pipeline; nothing of the batch is written, by any pipeline.
func TestRecordErrorsNameThePipeline(t *testing.T) {
	cases := []struct {
		name, value, want string
		where             string // replaces the orders pipeline's where
	}{
		{"missing field", `{"status":"new","amount":1,"ts":"2026-12-01T09:00:00Z"}`, "pipeline orders: record orders[0]@1: upsert.columns.customer: no such key: customer", ""},
		{"time does not parse", order("o", "new", "c", "fr", "1", "yesterday"), "pipeline revenue_per_minute: record orders[0]@1: rollup.time: a string that is not an RFC 3339 time", ""},
		{"amount not a number", order("o", "new", "c", "fr", `"ten"`, "2026-12-01T09:00:00Z"), "pipeline orders: record orders[0]@1: upsert.columns.amount:", ""},
		{"where not a bool", `{"status":"new","flag":"yes","amount":1,"ts":"2026-12-01T09:00:00Z","customer":{"id":"c","country":"fr"}}`,
			"pipeline orders: record orders[0]@1: where: yields string, not a bool", "value.flag"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			yaml := ordersYAML
			if tc.where != "" {
				yaml = strings.Replace(yaml, `where: value.status != "test"`, "where: "+tc.where, 1)
			}
			pool, p := setup(t, yaml, ordersTables)
			err := apply(t, pool, p,
				rec(t, 0, "ok", strings.Replace(order("ok", "new", "c", "fr", "1", "2026-12-01T09:00:00Z"), `{`, `{"flag":true,`, 1)),
				rec(t, 1, "bad", tc.value))
			if !processor.IsPermanent(err) || !store.IsRecordError(err) {
				t.Fatalf("err = %v, want a permanent record error", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %q, want it to contain %q", err, tc.want)
			}
			assertRows(t, pool, `SELECT count(*)::text FROM orders`, "0")
			assertRows(t, pool, `SELECT count(*)::text FROM revenue_per_minute`, "0")
		})
	}
}

// A value PostgreSQL refuses for its column is a record error (SQLSTATE
// class 22); alone in its batch, as the engine isolates it, the error
// names the pipeline.
func TestValuePostgresRefusesNamesThePipeline(t *testing.T) {
	pool, p := setup(t, ordersYAML, ordersTables)
	huge := order("o", "new", "c", "fr", "1e30", "2026-12-01T09:00:00Z") // numeric(12,2) overflows
	err := apply(t, pool, p, rec(t, 0, "a", order("a", "new", "c", "fr", "1", "2026-12-01T09:00:00Z")), rec(t, 1, "o", huge))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || !store.IsRecordError(err) {
		t.Fatalf("batch: err = %v, want a PostgreSQL record error", err)
	}
	err = apply(t, pool, p, rec(t, 1, "o", huge))
	if !store.IsRecordError(err) || !strings.Contains(err.Error(), "pipeline orders: upsert 1 rows of orders") {
		t.Fatalf("alone: err = %v, want a record error naming pipeline orders", err)
	}
}

func TestEpochMillisAndTimestampTimes(t *testing.T) {
	yaml := strings.Replace(ordersYAML, "time: value.ts", "time: value.ts_ms", 1)
	pool, p := setup(t, yaml, ordersTables)
	v := `{"status":"new","amount":2,"ts_ms":1764579690000,"customer":{"id":"c","country":"fr"}}` // 2025-12-01T09:01:30Z
	if err := apply(t, pool, p, rec(t, 0, "k", v)); err != nil {
		t.Fatal(err)
	}
	assertRows(t, pool, `SELECT to_char(minute AT TIME ZONE 'UTC','YYYY-MM-DD HH24:MI') FROM revenue_per_minute`, "2025-12-01 09:01")
}

// The record variable: key, headers (the last of a name wins), timestamp,
// topic, partition and offset; bytes into a bytea column.
func TestRecordVariable(t *testing.T) {
	const yaml = `
kafka:
  topics: [orders]
pipelines:
  - name: meta
    topic: orders
    format: json
    upsert:
      table: meta
      key: { k: record.key }
      columns: { src: string(record.headers.source), topic: record.topic, part: record.partition, off: record.offset, at: record.timestamp, raw: record.headers.source }
`
	pool, p := setup(t, yaml, `CREATE TABLE meta (k bytea PRIMARY KEY, src text, topic text, part integer, off bigint, at timestamptz, raw bytea)`)
	r := rec(t, 41, "key-1", `{}`)
	r.Partition = 3
	r.Headers = []processor.Header{{Key: "source", Value: []byte("first")}, {Key: "source", Value: []byte("web")}}
	b := processor.Batch{Topic: "orders", Partition: 3, Start: 41, Next: 42, Records: []processor.Record{r}}
	if err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error { return p.Process(context.Background(), tx, b) }); err != nil {
		t.Fatal(err)
	}
	assertRows(t, pool, `SELECT convert_from(k, 'UTF8')||' '||src||' '||topic||' '||part||' '||off||' '||to_char(at AT TIME ZONE 'UTC', 'HH24:MI:SS')||' '||encode(raw, 'escape') FROM meta`,
		"key-1 web orders 3 41 09:00:41 web")
}

// Values are converted for their column's type in ratchet where it can:
// what does not convert is a record error naming the pipeline and the
// column, before any statement runs.
func TestValuesThatDoNotFitTheirColumn(t *testing.T) {
	const yaml = `
kafka:
  topics: [orders]
pipelines:
  - name: counts
    topic: orders
    format: json
    upsert:
      table: counts
      key: { id: string(record.key) }
      columns: { n: value.n }
  - name: totals
    topic: orders
    format: json
    rollup:
      table: totals
      time: record.timestamp
      bucket: 1h
      bucket_column: hour
      aggregates: { total: sum(value.x) }
`
	pool, p := setup(t, yaml, `CREATE TABLE counts (id text PRIMARY KEY, n integer);
CREATE TABLE totals (hour timestamptz PRIMARY KEY, total bigint);`)
	ok := []processor.Record{rec(t, 0, "a", `{"n":"12","x":2}`), rec(t, 1, "b", `{"n":3.0,"x":3.0}`)}
	if err := apply(t, pool, p, ok...); err != nil {
		t.Fatal(err)
	}
	assertRows(t, pool, `SELECT id||' '||n FROM counts ORDER BY id`, "a 12", "b 3")
	assertRows(t, pool, `SELECT total::text FROM totals`, "5")
	for _, tc := range []struct{ value, want string }{
		{`{"n":"twelve","x":1}`, `pipeline counts: record orders[0]@2: upsert.columns.n: the string "twelve" is not an integer for a integer column`},
		{`{"n":1.5,"x":1}`, `pipeline counts: record orders[0]@2: upsert.columns.n: the double 1.5 is not an integer`},
		{`{"n":1,"x":2.5}`, `pipeline totals: rollup.aggregates.total: 2.5 is not an integer for a bigint column`},
		{`{"n":1e10,"x":1}`, `pipeline counts: upsert 1 rows of counts`}, // int8 → integer: PostgreSQL refuses the range
	} {
		err := apply(t, pool, p, rec(t, 2, "c", tc.value))
		if !store.IsRecordError(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want a record error containing %q", tc.value, err, tc.want)
		}
	}
}

// Check names every problem of a table that exists: a bucket column that
// is not timestamptz, a unique index that is partial (ON CONFLICT cannot
// use it), a missing column.
func TestCheckReportsEveryProblem(t *testing.T) {
	cfg, err := loadConfig(t, ordersYAML)
	if err != nil {
		t.Fatal(err)
	}
	set, err := pipeline.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `
CREATE TABLE orders (order_id text, customer text, updated_at timestamptz);
CREATE UNIQUE INDEX ON orders (order_id) WHERE customer IS NOT NULL;
CREATE TABLE revenue_per_minute (country text, minute timestamp, orders bigint, revenue float8, biggest float8, smallest float8,
  PRIMARY KEY (country, minute));`); err != nil {
		t.Fatal(err)
	}
	_, err = pipeline.Check(ctx, pool, set)
	var se *pipeline.SchemaError
	if !errors.As(err, &se) || !config.IsConfigError(err) || len(se.CreateTables) != 0 {
		t.Fatalf("err = %v, want a *SchemaError (a configuration error) without CREATE TABLE", err)
	}
	for _, want := range []string{
		"pipelines[0].upsert.columns.amount: pipeline orders: table orders has no column amount",
		"pipelines[0].upsert.key: pipeline orders: no unique constraint or primary key of orders covers exactly the upsert key (order_id)",
		"pipelines[1].rollup.bucket_column: pipeline revenue_per_minute: column minute of revenue_per_minute is timestamp without time zone, not timestamptz",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("problems lack %q:\n%s", want, err)
		}
	}
	if n := len(se.Problems.Problems); n != 3 {
		t.Errorf("%d problems, want 3:\n%s", n, err)
	}
}

// Check accepts exactly the tables the statements can use: a unique
// index matched on its key columns (INCLUDE columns aside), not
// deferrable (ON CONFLICT refuses it with 55000 at run time), valid; and
// columns of a type that can take the expression's static type, where it
// is known (a type only records can tell is judged per record).
func TestCheckIndexesAndTypes(t *testing.T) {
	const upsert = `
kafka:
  topics: [orders]
pipelines:
  - name: items
    topic: orders
    format: json
    upsert:
      table: items
      key:     { a: string(record.key) }
      columns: { b: value.b, at: record.timestamp, n: int(value.n), ok: value.flag == 1 }
`
	const rollup = `
kafka:
  topics: [orders]
pipelines:
  - name: totals
    topic: orders
    format: json
    rollup:
      table: totals
      time: value.ts
      bucket: 1m
      bucket_column: minute
      group_by: { g: string(value.g) }
      aggregates: { n: count, s: sum(double(value.x)), hi: max(value.x) }
`
	cases := []struct {
		name, yaml, tables, want string // want "": accepted
	}{
		{"primary key with INCLUDE", upsert, `CREATE TABLE items (a text, b text, at timestamptz, n bigint, ok boolean, PRIMARY KEY (a) INCLUDE (b))`, ""},
		{"unique index whose INCLUDE column is no key", upsert,
			`CREATE TABLE items (a text, b text, at timestamptz, n bigint, ok boolean); CREATE UNIQUE INDEX ON items (b) INCLUDE (a)`,
			"no unique constraint or primary key of items covers exactly the upsert key (a)"},
		{"deferrable primary key", upsert,
			`CREATE TABLE items (a text PRIMARY KEY DEFERRABLE, b text, at timestamptz, n bigint, ok boolean)`,
			"pipelines[0].upsert.key: pipeline items: the unique index of items on (a) is DEFERRABLE"},
		{"deferrable beside a usable one", upsert,
			`CREATE TABLE items (a text UNIQUE DEFERRABLE INITIALLY DEFERRED, b text, at timestamptz, n bigint, ok boolean); CREATE UNIQUE INDEX ON items (a)`, ""},
		{"timestamp into a number", upsert, `CREATE TABLE items (a text PRIMARY KEY, b text, at bigint, n bigint, ok boolean)`,
			"pipelines[0].upsert.columns.at: pipeline items: column at of items is bigint: the expression yields a timestamp"},
		{"timestamp into text and json into anything", upsert, `CREATE TABLE items (a text PRIMARY KEY, b uuid, at text, n numeric, ok text)`, ""},
		{"int into a bool", upsert, `CREATE TABLE items (a text PRIMARY KEY, b text, at timestamptz, n boolean, ok boolean)`,
			"column n of items is boolean: the expression yields a number"},
		{"bool into a number", upsert, `CREATE TABLE items (a text PRIMARY KEY, b text, at timestamptz, n bigint, ok integer)`,
			"column ok of items is integer: the expression yields a bool"},
		{"rollup as it should be", rollup, `CREATE TABLE totals (g text, minute timestamptz, n integer, s numeric, hi bigint, PRIMARY KEY (g, minute))`, ""},
		{"count into text", rollup, `CREATE TABLE totals (g text, minute timestamptz, n text, s float8, hi float8, PRIMARY KEY (g, minute))`,
			"pipelines[0].rollup.aggregates.n: pipeline totals: column n of totals is text: count needs a number column"},
		{"sum of a double into bigint", rollup, `CREATE TABLE totals (g text, minute timestamptz, n bigint, s bigint, hi float8, PRIMARY KEY (g, minute))`,
			"column s of totals is bigint: sum of a double needs a column that keeps fractions"},
		{"max into text", rollup, `CREATE TABLE totals (g text, minute timestamptz, n bigint, s float8, hi text, PRIMARY KEY (g, minute))`,
			"column hi of totals is text: max needs a number column"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := loadConfig(t, tc.yaml)
			if err != nil {
				t.Fatal(err)
			}
			set, err := pipeline.Compile(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			pool, err := pgxpool.New(ctx, testenv.Postgres(t))
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			if _, err := pool.Exec(ctx, tc.tables); err != nil {
				t.Fatal(err)
			}
			_, err = pipeline.Check(ctx, pool, set)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !config.IsConfigError(err) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("err = %v, want a configuration error containing %q", err, tc.want)
			}
		})
	}
}

// The CREATE TABLE Check suggests types record's fields as what they
// are: record.timestamp a timestamptz, not text.
func TestCheckSuggestsRecordFieldTypes(t *testing.T) {
	cfg, err := loadConfig(t, ordersYAML)
	if err != nil {
		t.Fatal(err)
	}
	set, err := pipeline.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	_, err = pipeline.Check(ctx, pool, set)
	var se *pipeline.SchemaError
	if !errors.As(err, &se) || len(se.CreateTables) != 2 {
		t.Fatalf("err = %v, want a *SchemaError with two CREATE TABLE", err)
	}
	if !strings.Contains(se.CreateTables[0], "updated_at timestamptz,") {
		t.Errorf("CREATE TABLE types record.timestamp otherwise:\n%s", se.CreateTables[0])
	}
	// What it suggests passes Check.
	if _, err := pool.Exec(ctx, strings.Join(se.CreateTables, "\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := pipeline.Check(ctx, pool, set); err != nil {
		t.Fatalf("check of the suggested tables: %v", err)
	}
}
