package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"ratchet/config"
	"ratchet/internal/store"
	"ratchet/internal/testenv"
	"ratchet/processor"
	"ratchet/processor/pipeline"
)

// eventsYAML appends every order that is not a test to events, next to
// the orders upsert of the same topic.
const eventsYAML = `
kafka:
  topics: [orders]
pipelines:
  - name: orders
    topic: orders
    format: json
    upsert:
      table: orders
      key:     { order_id: string(record.key) }
      columns: { customer: value.customer.id, amount: double(value.amount), updated_at: record.timestamp }
      on_tombstone: delete
  - name: events
    topic: orders
    format: json
    where: value.status != "test"
    append:
      table: events
      columns: { part: record.partition, off: record.offset, order_id: string(record.key), status: value.status, amount: value.amount }
`

const eventsTables = ordersTables + `
CREATE TABLE events (part integer, off bigint, order_id text, status text, amount numeric(12,2));
`

const eventsRows = `SELECT part||' '||off||' '||order_id||' '||status||' '||amount FROM events ORDER BY part, off`

// An append inserts one row per record in offset order, batch after batch:
// where filters, a tombstone is ignored (while the upsert of the same
// topic deletes on it), and the rows commit with the batch.
func TestAppendWritesOneRowPerRecord(t *testing.T) {
	pool, p := setup(t, eventsYAML, eventsTables)
	err := apply(t, pool, p,
		rec(t, 0, "o1", order("o1", "new", "c1", "fr", "10.5", "2026-12-01T09:00:10Z")),
		rec(t, 1, "o2", order("o2", "test", "c2", "de", "7", "2026-12-01T09:00:20Z")),  // filtered
		rec(t, 2, "o1", order("o1", "paid", "c1", "fr", "12", "2026-12-01T09:00:50Z")), // same key: a second row
	)
	if err != nil {
		t.Fatal(err)
	}
	err = apply(t, pool, p,
		rec(t, 3, "o1", ""), // a tombstone: ignored by the append
		rec(t, 4, "o3", order("o3", "new", "c3", "fr", "1", "2026-12-01T09:01:05Z")),
	)
	if err != nil {
		t.Fatal(err)
	}
	assertRows(t, pool, eventsRows, "0 0 o1 new 10.50", "0 2 o1 paid 12.00", "0 4 o3 new 1.00")
	assertRows(t, pool, ordersRows, "o2 c2 7.00", "o3 c3 1.00")
	// A batch that fails (here a record the upsert cannot evaluate) writes
	// no row of the append either.
	err = apply(t, pool, p, rec(t, 5, "o4", order("o4", "new", "c4", "fr", "2", "2026-12-01T09:01:05Z")),
		rec(t, 6, "o5", `{"status":"new","amount":1}`))
	if !processor.IsPermanent(err) || !store.IsRecordError(err) {
		t.Fatalf("err = %v, want a permanent record error", err)
	}
	assertRows(t, pool, `SELECT count(*)::text FROM events`, "3")
}

// Every value reaches its column as it would reach an upsert's: the
// common types and those cast from text, escapes of COPY's text format,
// nulls, and times before the common era.
func TestAppendColumnTypes(t *testing.T) {
	const yaml = `
kafka:
  topics: [orders]
pipelines:
  - name: typed
    topic: orders
    format: json
    append:
      table: typed
      columns:
        n: value.n
        d: value.d
        big: value.big
        flag: value.flag
        at: value.at
        wall: value.at
        id: value.id
        doc: value.doc
        code: value.code
        short: value.short
        note: value.note
        raw: record.key
        missing: value.?missing.orValue(null)
`
	const tables = `CREATE TABLE typed (n numeric(10,3), d double precision, big bigint, flag boolean, at timestamptz, wall timestamp,
  id uuid, doc jsonb, code character(3), short varchar(5), note text, raw bytea, missing text)`
	pool, p := setup(t, yaml, tables)
	cases := []struct{ value, want string }{
		{`{"n":"1.2345","d":0.1,"big":9007199254740993,"flag":true,"at":"2026-12-01T09:00:00.1234567+02:00","id":"{A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11}",` +
			`"doc":{"a":[1,"x"]},"code":"ab","short":"hi   ","note":"tab\there\nnew line\\back\r"}`,
			`1.235|0.1|9007199254740993|true|2026-12-01 07:00:00.123456|2026-12-01 07:00:00.123456|a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11|{"a": [1, "x"]}|ab|hi   |"tab\there\nnew line\\back\r"|k|`},
		{`{"n":7,"d":"1e300","big":"-5","flag":"false","at":"0001-01-01T00:00:00Z","id":"a0eebc999c0b4ef8bb6d6bb9bd380a11","doc":"[2]","code":"xyz","short":"","note":""}`,
			`7.000|1e+300|-5|false|0001-01-01 00:00:00.000000|0001-01-01 00:00:00.000000|a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11|[2]|xyz||""|k|`},
		{`{"n":null,"d":null,"big":null,"flag":null,"at":null,"id":null,"doc":null,"code":null,"short":null,"note":null,"missing":"m"}`,
			`||||||||||null|k|m`},
	}
	recs := make([]processor.Record, len(cases))
	for i, tc := range cases {
		recs[i] = rec(t, int64(i), "k", tc.value)
	}
	if err := apply(t, pool, p, recs...); err != nil {
		t.Fatal(err)
	}
	want := make([]string, len(cases))
	for i, tc := range cases {
		want[i] = tc.want
	}
	assertRows(t, pool, `SELECT concat_ws('|', coalesce(n::text,''), coalesce(d::text,''), coalesce(big::text,''), coalesce(flag::text,''),
  coalesce(to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'),''), coalesce(to_char(wall, 'YYYY-MM-DD HH24:MI:SS.US'),''),
  coalesce(id::text,''), coalesce(doc::text,''), coalesce(code::text,''),
  coalesce(short,''), coalesce(to_json(note)::text,'null'), encode(raw, 'escape'), coalesce(missing,''))
FROM typed ORDER BY ctid`, strings.Join(want, "\n"))
}

// A value PostgreSQL refuses (class 22) fails the batch with its
// SQLSTATE, as a record error naming the pipeline and its table; alone in
// its batch, as the engine isolates it, the same.
func TestAppendValuePostgresRefuses(t *testing.T) {
	// The upsert of orders leaves amount out: only events refuses it.
	pool, p := setup(t, strings.Replace(eventsYAML, "amount: double(value.amount), ", "", 1), eventsTables)
	huge := order("o", "new", "c", "fr", "1e30", "2026-12-01T09:00:00Z") // numeric(12,2) overflows
	for _, recs := range [][]processor.Record{
		{rec(t, 0, "a", order("a", "new", "c", "fr", "1", "2026-12-01T09:00:00Z")), rec(t, 1, "o", huge)},
		{rec(t, 1, "o", huge)},
	} {
		err := apply(t, pool, p, recs...)
		var pgErr *pgconn.PgError
		var re *pipeline.RecordError
		if !errors.As(err, &pgErr) || pgErr.Code != "22003" || !store.IsRecordError(err) || !errors.As(err, &re) {
			t.Fatalf("%d records: err = %v, want a PostgreSQL record error", len(recs), err)
		}
		if re.Pipeline != "events" || re.Table != "events" || !strings.Contains(err.Error(), "pipeline events: append ") {
			t.Fatalf("%d records: err = %v (pipeline %q, table %q), want it to name pipeline and table events", len(recs), err, re.Pipeline, re.Table)
		}
	}
	assertRows(t, pool, `SELECT count(*)::text FROM events`, "0")
	// A NUL in a string is refused by PostgreSQL (22021), as in an
	// upsert's statement: COPY's text format does not cut it short.
	err := apply(t, pool, p, rec(t, 2, "n", `{"status":"a\u0000b","amount":1,"customer":{"id":"c"}}`))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "22021" || !store.IsRecordError(err) || !strings.Contains(err.Error(), "pipeline events: append 1 rows to events") {
		t.Fatalf("NUL: err = %v, want PostgreSQL's 22021 naming pipeline events", err)
	}
}

// A fault of the table (a column dropped, the table dropped, no
// privilege) is a configuration error, whatever the record.
func TestAppendTableFaultIsConfigurationError(t *testing.T) {
	for _, tc := range []struct{ name, ddl, code string }{
		{"missing column", `ALTER TABLE events DROP COLUMN status`, "42703"},
		{"missing table", `DROP TABLE events`, "42P01"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, p := setup(t, eventsYAML, eventsTables)
			if _, err := pool.Exec(context.Background(), tc.ddl); err != nil {
				t.Fatal(err)
			}
			err := apply(t, pool, p, rec(t, 0, "a", order("a", "new", "c", "fr", "1", "2026-12-01T09:00:00Z")))
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != tc.code || !store.IsConfigurationError(err) {
				t.Fatalf("err = %v, want a configuration error with SQLSTATE %s", err, tc.code)
			}
		})
	}
}

// Without the privilege to insert into the table (42501), the COPY's
// error is a configuration error naming the pipeline's table.
func TestAppendWithoutPrivilegeIsConfigurationError(t *testing.T) {
	pool, p := setup(t, eventsYAML, eventsTables)
	ctx := context.Background()
	var db string
	if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	role := pgx.Identifier{"reader_" + db}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE ROLE `+role+`; GRANT ALL ON orders TO `+role+`; GRANT SELECT ON events TO `+role); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP OWNED BY `+role+`; DROP ROLE `+role) })
	b := processor.Batch{Topic: "orders", Start: 0, Next: 1, Records: []processor.Record{rec(t, 0, "a", order("a", "new", "c", "fr", "1", "2026-12-01T09:00:00Z"))}}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+role); err != nil {
			return err
		}
		return p.Process(ctx, tx, b)
	})
	var pgErr *pgconn.PgError
	var re *pipeline.RecordError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" || !store.IsConfigurationError(err) || !errors.As(err, &re) || re.Table != "events" {
		t.Fatalf("err = %v, want a configuration error with SQLSTATE 42501 naming table events", err)
	}
}

// The COPY runs inside the batch's transaction: rolled back with it.
func TestAppendRollsBackWithTheBatch(t *testing.T) {
	pool, p := setup(t, eventsYAML, eventsTables)
	b := processor.Batch{Topic: "orders", Start: 0, Next: 1, Records: []processor.Record{rec(t, 0, "a", order("a", "new", "c", "fr", "1", "2026-12-01T09:00:00Z"))}}
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Process(ctx, tx, b); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	assertRows(t, pool, `SELECT count(*)::text FROM events`, "0")
	// Outside a transaction the COPY is refused: it would commit alone.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	err = p.Process(ctx, notInTx{conn.Conn()}, b)
	if err == nil || !strings.Contains(err.Error(), "transaction is not open") {
		t.Fatalf("err = %v, want the COPY refused outside a transaction", err)
	}
	assertRows(t, pool, `SELECT count(*)::text FROM events`, "0")
}

// notInTx is a pgx.Tx whose connection is in no transaction.
type notInTx struct{ c *pgx.Conn }

func (n notInTx) Begin(ctx context.Context) (pgx.Tx, error) { return n.c.Begin(ctx) }
func (notInTx) Commit(context.Context) error                { return nil }
func (notInTx) Rollback(context.Context) error              { return nil }
func (n notInTx) CopyFrom(ctx context.Context, t pgx.Identifier, c []string, s pgx.CopyFromSource) (int64, error) {
	return n.c.CopyFrom(ctx, t, c, s)
}
func (n notInTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return n.c.SendBatch(ctx, b)
}
func (n notInTx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }
func (n notInTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return n.c.Prepare(ctx, name, sql)
}
func (n notInTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return n.c.Exec(ctx, sql, args...)
}
func (n notInTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return n.c.Query(ctx, sql, args...)
}
func (n notInTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return n.c.QueryRow(ctx, sql, args...)
}
func (n notInTx) Conn() *pgx.Conn { return n.c }

// Configuration: exactly one sink; an append's keys; an append may share
// a table with another append, never with an upsert or a rollup.
func TestAppendConfiguration(t *testing.T) {
	const head = "kafka:\n  topics: [orders]\npipelines:\n"
	const appendE = "    append: {table: events, columns: {id: string(record.key)}}\n"
	const upsertE = "    upsert: {table: events, key: {id: string(record.key)}}\n"
	const rollupE = "    rollup: {table: events, time: record.timestamp, bucket: 1m, bucket_column: minute, aggregates: {n: count}}\n"
	pl := func(name, sink string) string {
		return "  - name: " + name + "\n    topic: orders\n    format: json\n" + sink
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"append and upsert", head + pl("a", appendE+strings.Replace(upsertE, "events", "t", 1)), "pipelines[0]: two sinks: give it one of upsert, rollup or append"},
		{"unknown append key", head + pl("a", "    append: {table: events, key: {id: value.id}}\n"), "pipelines[0].append.key: unknown key"},
		{"append without columns", head + pl("a", "    append: {table: events}\n"), `pipelines[0].append.columns: "" is not allowed`},
		{"append bad table", head + pl("a", "    append: {table: 'e;x', columns: {id: value.id}}\n"), `pipelines[0].append.table: "e;x" is not allowed`},
		{"append column does not compile", head + pl("a", "    append: {table: events, columns: {id: 'value.id +'}}\n"),
			"pipelines[0].append.columns.id: CEL does not compile"},
		{"upsert after append on one table", head + pl("a", appendE) + pl("b", upsertE),
			"pipelines[1].upsert.table: pipeline b writes table events, which pipeline a (pipelines[0]) writes too"},
		{"append after upsert on one table", head + pl("a", upsertE) + pl("b", appendE),
			"pipelines[1].append.table: pipeline b writes table events, which pipeline a (pipelines[0]) writes too"},
		{"rollup after append on one table", head + pl("a", appendE) + pl("b", rollupE),
			"pipelines[1].rollup.table: pipeline b writes table events, which pipeline a (pipelines[0]) writes too: two pipelines may share a table only when both are rollups or both are appends"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := loadConfig(t, tc.yaml)
			if err == nil {
				_, err = pipeline.Compile(cfg)
			}
			if !config.IsConfigError(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want a configuration error containing %q", err, tc.want)
			}
		})
	}
	cfg, err := loadConfig(t, head+pl("a", appendE)+pl("b", appendE))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pipeline.Compile(cfg); err != nil {
		t.Fatalf("two appends sharing a table: %v", err)
	}
}

// check: the table and its columns must exist and take the expressions'
// types; no unique key is needed; a missing table gets a CREATE TABLE
// without a primary key.
func TestAppendCheck(t *testing.T) {
	cfg, err := loadConfig(t, eventsYAML)
	if err != nil {
		t.Fatal(err)
	}
	set, err := pipeline.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pool, _ := setup(t, ordersYAML, ordersTables) // a database with orders only
	_, err = pipeline.Check(context.Background(), pool, set)
	var se *pipeline.SchemaError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "pipelines[1].append.table: pipeline events: table events does not exist") {
		t.Fatalf("err = %v, want the missing table", err)
	}
	create := strings.Join(se.CreateTables, "\n")
	if !strings.Contains(create, "CREATE TABLE events") || strings.Contains(create, "PRIMARY KEY") || !strings.Contains(create, "part bigint") {
		t.Fatalf("CREATE TABLE = %s, want events without a primary key", create)
	}
	if _, err := pool.Exec(context.Background(), create); err != nil {
		t.Fatalf("the printed CREATE TABLE does not run: %v\n%s", err, create)
	}
	if _, err := pipeline.Check(context.Background(), pool, set); err != nil {
		t.Fatalf("check after the printed CREATE TABLE: %v", err)
	}
	if _, err := pool.Exec(context.Background(), `ALTER TABLE events DROP COLUMN status, ALTER COLUMN off TYPE boolean USING false`); err != nil {
		t.Fatal(err)
	}
	_, err = pipeline.Check(context.Background(), pool, set)
	for _, want := range []string{"pipelines[1].append.columns.status: pipeline events: table events has no column status",
		"pipelines[1].append.columns.off: pipeline events: column off of events is boolean"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("err = %v, want %q", err, want)
		}
	}
}

// Behind PgBouncer in transaction mode, with the exec mode ratchet picks
// there, an append's COPY needs no session: batches of several clients
// over two server sessions each land once.
func TestAppendBehindPgBouncer(t *testing.T) {
	cfg, err := loadConfig(t, eventsYAML)
	if err != nil {
		t.Fatal(err)
	}
	set, err := pipeline.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	db := testenv.Postgres(t)
	direct, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(ctx)
	if _, err := direct.Exec(ctx, eventsTables); err != nil {
		t.Fatal(err)
	}
	bouncer := testenv.StartPgBouncer(t, db, testenv.PgBouncerOptions{PoolSize: 2})
	pool, err := store.Open(ctx, bouncer.URL(), 6)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if mode := pool.Config().ConnConfig.DefaultQueryExecMode; mode != store.PoolerExecMode {
		t.Fatalf("exec mode %v behind pgbouncer, want %v", mode, store.PoolerExecMode)
	}
	schema, err := pipeline.Check(ctx, pool, set)
	if err != nil {
		t.Fatal(err)
	}
	p := pipeline.New(set, schema, nil)
	const clients, batches, size = 6, 10, 5
	errs := make(chan error, clients)
	for c := range clients {
		go func() {
			for b := range batches {
				recs := make([]processor.Record, size)
				for i := range recs {
					off := int64(b*size + i)
					recs[i] = rec(t, off, "k", order("k", "new", "c", "fr", "1", "2026-12-01T09:00:00Z"))
					recs[i].Partition = int32(c)
				}
				batch := processor.Batch{Topic: "orders", Partition: int32(c), Start: recs[0].Offset, Next: recs[size-1].Offset + 1, Records: recs}
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return p.Process(ctx, tx, batch) }); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range clients {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	assertRows(t, pool, `SELECT count(*)||' '||count(DISTINCT (part, off)) FROM events`, fmt.Sprintf("%d %d", clients*batches*size, clients*batches*size))
}
