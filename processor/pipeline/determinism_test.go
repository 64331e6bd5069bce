package pipeline_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/config"
	"ratchet/internal/store"
	"ratchet/internal/testenv"
	"ratchet/processor"
	"ratchet/processor/pipeline"
)

// docsYAML is an upsert whose columns PostgreSQL may refuse (jsonb,
// numeric(5,2), a CHECK, varchar(8)) and a rollup of the same topic.
const docsYAML = `
kafka:
  topics: [orders]
pipelines:
  - name: docs
    topic: orders
    format: json
    upsert:
      table: docs
      key:     { id: string(record.key) }
      columns: { body: value.body, price: value.price, qty: value.qty, code: value.code }
      on_tombstone: delete
  - name: per_group
    topic: orders
    format: json
    rollup:
      table: per_group
      time: value.ts
      bucket: 1m
      bucket_column: minute
      group_by: { g: value.g }
      aggregates: { n: count, qty: sum(int(value.qty)) }
`

const docsTables = `
CREATE TABLE docs (id text PRIMARY KEY, body jsonb, price numeric(5,2), qty integer CHECK (qty >= 0), code varchar(8));
CREATE TABLE per_group (g text NOT NULL, minute timestamptz NOT NULL, n bigint, qty bigint, PRIMARY KEY (g, minute));
`

const (
	docsRows     = `SELECT id||' '||body::text||' '||price||' '||qty||' '||code FROM docs ORDER BY id`
	perGroupRows = `SELECT g||' '||to_char(minute AT TIME ZONE 'UTC','HH24:MI')||' '||n||' '||qty FROM per_group ORDER BY g, minute`
)

// docInput is one record of the docs stream and what must become of it.
type docInput struct {
	key, value string // value "" is a tombstone
	bad        string // why the record is dead-lettered; "" when it is applied
	g          string
	qty        int
	minute     int
	row        string // the docs row it leaves
}

// docStream makes n records over 11 keys: about 2 % carry a value
// PostgreSQL refuses (NUL in jsonb, a numeric(5,2) overflow, the CHECK, a
// string too long for varchar(8)), mostly superseded by a later record of
// their key; about 1 % a value ratchet refuses (a qty that is not an
// integer); about 3 % are tombstones.
func docStream(n int) []docInput {
	out := make([]docInput, 0, n)
	for i := range n {
		d := docInput{key: fmt.Sprintf("k%02d", i*i%11), g: []string{"a", "b", "c"}[i%3], qty: i % 9, minute: i / 60}
		body, price, code := fmt.Sprintf(`{"n": %d}`, i), fmt.Sprintf("%d.25", i%100), fmt.Sprintf("c%d", i)
		qty := fmt.Sprint(d.qty)
		switch {
		case i%97 == 11:
			body, d.bad = `{"n": "a\u0000b"}`, "22P05" // jsonb refuses NUL
		case i%89 == 13:
			price, d.bad = "1234.5", "22003" // numeric(5,2) overflows
		case i%83 == 17:
			qty, d.qty, d.bad = "-1", -1, "23514" // the CHECK
		case i%79 == 19:
			code, d.bad = `"much too long"`, "22001" // varchar(8)
		case i%101 == 23:
			qty, d.bad = `"many"`, "upsert.columns.qty" // ratchet refuses it
		case i%37 == 36:
			out = append(out, d) // a tombstone
			continue
		}
		if !strings.HasPrefix(code, `"`) {
			code = `"` + code + `"`
		}
		d.value = fmt.Sprintf(`{"body": %s, "price": %s, "qty": %s, "code": %s, "g": %q, "ts": "2026-12-01T09:%02d:00Z"}`,
			body, price, qty, code, d.g, d.minute)
		d.row = fmt.Sprintf(`%s {"n": %d} %s %d %s`, d.key, i, price, d.qty, strings.Trim(code, `"`))
		out = append(out, d)
	}
	return out
}

// docModel computes, without ratchet, the tables the docs stream must
// leave and the offsets it must dead-letter: the records applied one by
// one in offset order, a refused record applied by neither pipeline.
func docModel(in []docInput) (docs, groups []string, dead []int64) {
	rows := map[string]string{}
	type agg struct{ n, qty int }
	aggs := map[string]*agg{}
	for i, d := range in {
		switch {
		case d.bad != "":
			dead = append(dead, int64(i))
		case d.value == "":
			delete(rows, d.key)
		default:
			rows[d.key] = d.row
			k := fmt.Sprintf("%s 09:%02d", d.g, d.minute)
			if aggs[k] == nil {
				aggs[k] = &agg{}
			}
			aggs[k].n++
			aggs[k].qty += d.qty
		}
	}
	for _, r := range rows {
		docs = append(docs, r)
	}
	for k, a := range aggs {
		groups = append(groups, fmt.Sprintf("%s %d %d", k, a.n, a.qty))
	}
	slices.Sort(docs)
	slices.Sort(groups)
	return docs, groups, dead
}

// applyBisecting applies recs in batches of size n as the engine does: a
// batch that fails with a record error is split in halves until the
// record is alone, and then dead-lettered. It returns the dead-lettered
// offsets and the errors that named them.
func applyBisecting(tb testing.TB, pool *pgxpool.Pool, p *pipeline.Processor, recs []processor.Record, n int) ([]int64, map[int64]error) {
	tb.Helper()
	var dead []int64
	why := map[int64]error{}
	var run func(batch []processor.Record)
	run = func(batch []processor.Record) {
		err := apply(tb, pool, p, batch...)
		switch {
		case err == nil:
			return
		case !store.IsRecordError(err):
			tb.Fatalf("batch %d..%d: %v, want nil or a record error", batch[0].Offset, batch[len(batch)-1].Offset, err)
		case len(batch) == 1:
			dead = append(dead, batch[0].Offset)
			why[batch[0].Offset] = err
			return
		}
		run(batch[:len(batch)/2])
		run(batch[len(batch)/2:])
	}
	for i := 0; i < len(recs); i += n {
		run(recs[i:min(i+n, len(recs))])
	}
	return dead, why
}

// TestResultsDoNotDependOnBatchBoundaries: one stream, applied in batches
// of 1, 7 and 500 with bisection, leaves the same tables and dead-letters
// the same records, those of the model: a value PostgreSQL refuses is
// refused also when a later record of its key supersedes it in the batch.
func TestResultsDoNotDependOnBatchBoundaries(t *testing.T) {
	in := docStream(600)
	wantDocs, wantGroups, wantDead := docModel(in)
	for _, size := range []int{1, 7, 500} {
		t.Run(fmt.Sprintf("batch size %d", size), func(t *testing.T) {
			pool, p := setup(t, docsYAML, docsTables)
			recs := make([]processor.Record, len(in))
			for i, d := range in {
				recs[i] = rec(t, int64(i), d.key, d.value)
			}
			dead, why := applyBisecting(t, pool, p, recs, size)
			if !slices.Equal(dead, wantDead) {
				t.Errorf("dead letters %v, want %v", dead, wantDead)
			}
			for off, err := range why {
				if want := in[off].bad; !strings.Contains(err.Error(), want) {
					t.Errorf("record %d: %v, want %s", off, err, want)
				}
			}
			assertRows(t, pool, docsRows, wantDocs...)
			assertRows(t, pool, perGroupRows, wantGroups...)
		})
	}
}

// TestSupersededVersionIsJudged: a value PostgreSQL refuses fails its
// batch even when a later record of the same key in the batch supersedes
// it, for every kind of refusal.
func TestSupersededVersionIsJudged(t *testing.T) {
	good := func(n int) string {
		return fmt.Sprintf(`{"body": {"n": %d}, "price": 1, "qty": 1, "code": "c", "g": "a", "ts": "2026-12-01T09:00:00Z"}`, n)
	}
	cases := []struct{ name, value, sqlstate string }{
		{"NUL in jsonb", `{"body": {"n": "\u0000"}, "price": 1, "qty": 1, "code": "c", "g": "a", "ts": "2026-12-01T09:00:00Z"}`, "22P05"},
		{"numeric overflow", `{"body": {}, "price": 1000, "qty": 1, "code": "c", "g": "a", "ts": "2026-12-01T09:00:00Z"}`, "22003"},
		{"CHECK", `{"body": {}, "price": 1, "qty": -5, "code": "c", "g": "a", "ts": "2026-12-01T09:00:00Z"}`, "23514"},
		{"varchar too long", `{"body": {}, "price": 1, "qty": 1, "code": "ninechars", "g": "a", "ts": "2026-12-01T09:00:00Z"}`, "22001"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pool, p := setup(t, docsYAML, docsTables)
			err := apply(t, pool, p, rec(t, 0, "k", good(0)), rec(t, 1, "k", tc.value), rec(t, 2, "k", good(2)))
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != tc.sqlstate || !store.IsRecordError(err) {
				t.Fatalf("err = %v, want a record error with SQLSTATE %s", err, tc.sqlstate)
			}
			assertRows(t, pool, `SELECT count(*)::text FROM docs`, "0")
		})
	}
}

// TestKeysEqualForPostgresCollapse: keys that differ for ratchet but are
// equal for PostgreSQL are one key: in one batch the later record wins,
// and the statement never meets a row twice (SQLSTATE 21000).
func TestKeysEqualForPostgresCollapse(t *testing.T) {
	cases := []struct {
		name, typ string
		ids       []string // JSON values of value.id, in offset order
	}{
		{"float8 zero and minus zero", "double precision", []string{`0.0`, `-0.0`}},
		{"real rounding", "real", []string{`0.1`, `0.10000000001`}},
		{"timestamptz under a microsecond apart", "timestamptz", []string{`"2026-12-01T09:00:00.0000001Z"`, `"2026-12-01T09:00:00.0000009Z"`}},
		{"numeric spellings", "numeric", []string{`"1"`, `"1.0"`, `"1e0"`}},
		{"numeric rounded to its scale", "numeric(5,2)", []string{`"1.001"`, `"1.004"`}},
		{"uuid spellings", "uuid", []string{`"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"`, `"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"`, `"{a0eebc999c0b4ef8bb6d6bb9bd380a11}"`}},
		{"bpchar padding", "character(4)", []string{`"ab"`, `"ab  "`}},
		{"varchar drops excess spaces", "varchar(2)", []string{`"ab"`, `"ab   "`}},
		// Not normalized by ratchet: the statement collapses it.
		{"interval", "interval", []string{`"1 day"`, `"24 hours"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			yaml := "kafka:\n  topics: [orders]\npipelines:\n  - name: k\n    topic: orders\n    format: json\n" +
				"    upsert: {table: k, key: {id: value.id}, columns: {v: int(value.v)}}\n"
			pool, p := setup(t, yaml, "CREATE TABLE k (id "+tc.typ+" PRIMARY KEY, v int)")
			var recs []processor.Record
			for i, id := range tc.ids {
				recs = append(recs, rec(t, int64(i), "x", fmt.Sprintf(`{"id": %s, "v": %d}`, id, i+1)))
			}
			if err := apply(t, pool, p, recs...); err != nil {
				t.Fatalf("one batch: %v", err)
			}
			assertRows(t, pool, `SELECT count(*)||' '||max(v) FROM k`, fmt.Sprintf("1 %d", len(tc.ids)))
		})
	}
	t.Run("rollup group of math.ceil giving -0.0", func(t *testing.T) {
		yaml := "kafka:\n  topics: [orders]\npipelines:\n  - name: r\n    topic: orders\n    format: json\n" +
			"    rollup: {table: r, time: value.ts, bucket: 1m, bucket_column: minute, group_by: {g: math.ceil(double(value.x))}, aggregates: {n: count}}\n"
		pool, p := setup(t, yaml, "CREATE TABLE r (g double precision, minute timestamptz, n bigint, PRIMARY KEY (g, minute))")
		err := apply(t, pool, p,
			rec(t, 0, "x", `{"x": -0.5, "ts": "2026-12-01T09:00:00Z"}`),
			rec(t, 1, "x", `{"x": 0, "ts": "2026-12-01T09:00:10Z"}`))
		if err != nil {
			t.Fatalf("one batch: %v", err)
		}
		assertRows(t, pool, `SELECT count(*)||' '||sum(n) FROM r`, "1 2")
	})
}

// latestYAML keeps the latest state per user by event time.
const latestYAML = `
kafka:
  topics: [orders]
pipelines:
  - name: latest
    topic: orders
    format: json
    upsert:
      table: latest
      key:     { user_id: value.user }
      columns: { state: value.state, at: value.at }
      version: value.at
  - name: by_seq
    topic: orders
    format: json
    upsert:
      table: by_seq
      key:     { user_id: value.user }
      columns: { state: value.state }
      version: value.seq
`

const latestTables = `
CREATE TABLE latest (user_id text PRIMARY KEY, state text, at timestamptz);
CREATE TABLE by_seq (user_id text PRIMARY KEY, state text, version bigint);
`

// TestVersionedUpsertKeepsTheNewest: events of 30 users arrive with their
// versions shuffled; whatever the batches (sizes drawn at random, each
// batch by a new processor, as after a restart), each row is the event of
// the highest version, the later offset among equal versions.
func TestVersionedUpsertKeepsTheNewest(t *testing.T) {
	type event struct {
		user, state string
		seq         int
	}
	rng := rand.New(rand.NewPCG(7, 11))
	var events []event
	for i := range 600 {
		events = append(events, event{user: fmt.Sprintf("u%02d", i%30), state: fmt.Sprintf("s%d", i), seq: rng.IntN(40)})
	}
	want := map[string]event{}
	for _, e := range events {
		if w, ok := want[e.user]; !ok || w.seq <= e.seq {
			want[e.user] = e
		}
	}
	var wantLatest, wantSeq []string
	for u, e := range want {
		wantLatest = append(wantLatest, fmt.Sprintf("%s %s %02d", u, e.state, e.seq))
		wantSeq = append(wantSeq, fmt.Sprintf("%s %s %d", u, e.state, e.seq))
	}
	slices.Sort(wantLatest)
	slices.Sort(wantSeq)
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) {
			cfg, err := loadConfig(t, latestYAML)
			if err != nil {
				t.Fatal(err)
			}
			set, err := pipeline.Compile(cfg)
			if err != nil {
				t.Fatal(err)
			}
			pool, _ := setup(t, latestYAML, latestTables)
			schema, err := pipeline.Check(t.Context(), pool, set)
			if err != nil {
				t.Fatal(err)
			}
			batches := rand.New(rand.NewPCG(seed, 0))
			for i := 0; i < len(events); {
				n := 1 + batches.IntN(60)
				var recs []processor.Record
				for _, e := range events[i:min(i+n, len(events))] {
					recs = append(recs, rec(t, int64(i+len(recs)), e.user, fmt.Sprintf(
						`{"user": %q, "state": %q, "seq": %d, "at": "2026-12-01T09:00:%02dZ"}`, e.user, e.state, e.seq, e.seq)))
				}
				if err := apply(t, pool, pipeline.New(set, schema, nil), recs...); err != nil {
					t.Fatal(err)
				}
				i += n
			}
			assertRows(t, pool, `SELECT user_id||' '||state||' '||to_char(at AT TIME ZONE 'UTC', 'SS') FROM latest ORDER BY user_id`, wantLatest...)
			assertRows(t, pool, `SELECT user_id||' '||state||' '||version FROM by_seq ORDER BY user_id`, wantSeq...)
		})
	}
}

// TestVersionNotATimeOrNumberIsTheRecords: a version that is null or not
// a time (or a number, for a number column) fails its record, naming
// upsert.version.
func TestVersionNotATimeOrNumberIsTheRecords(t *testing.T) {
	cases := []struct{ name, value, want string }{
		{"null time", `{"user": "u", "state": "s", "seq": 1, "at": null}`, "pipeline latest: record orders[0]@0: upsert.version: no time (null)"},
		{"not a time", `{"user": "u", "state": "s", "seq": 1, "at": "later"}`, "pipeline latest: record orders[0]@0: upsert.version: "},
		{"not a number", `{"user": "u", "state": "s", "seq": "one", "at": "2026-12-01T09:00:00Z"}`, "pipeline by_seq: record orders[0]@0: upsert.version: the string \"one\" is not a version"},
		{"null number", `{"user": "u", "state": "s", "seq": null, "at": "2026-12-01T09:00:00Z"}`, "pipeline by_seq: record orders[0]@0: upsert.version:"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pool, p := setup(t, latestYAML, latestTables)
			err := apply(t, pool, p, rec(t, 0, "u", tc.value))
			if !processor.IsPermanent(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want a permanent error containing %q", err, tc.want)
			}
		})
	}
}

// TestSharedTables: two pipelines may write one table only when both are
// rollups; otherwise Compile refuses the later one's table, naming both
// pipelines, with the table names compared as PostgreSQL folds them.
func TestSharedTables(t *testing.T) {
	const head = "kafka:\n  topics: [orders]\npipelines:\n"
	pl := func(name, sink string) string {
		return "  - name: " + name + "\n    topic: orders\n    format: json\n" + sink
	}
	upsert := func(table string) string {
		return "    upsert: {table: " + table + ", key: {id: string(record.key)}, columns: {a: value.a}, on_tombstone: delete}\n"
	}
	rollup := func(table string) string {
		return "    rollup: {table: " + table + ", time: value.ts, bucket: 1m, bucket_column: minute, group_by: {c: value.c}, aggregates: {n: count}}\n"
	}
	cases := []struct{ name, yaml, want string }{
		{"two upserts", head + pl("a", upsert("t")) + pl("b", upsert("t")),
			"pipelines[1].upsert.table: pipeline b writes table t, which pipeline a (pipelines[0]) writes too"},
		{"case and public", head + pl("a", upsert("T")) + pl("b", upsert("public.t")),
			"pipelines[1].upsert.table: pipeline b writes table public.t, which pipeline a (pipelines[0]) writes too"},
		{"upsert and rollup", head + pl("a", rollup("t")) + pl("b", rollup("u")) + pl("c", upsert("t")),
			"pipelines[2].upsert.table: pipeline c writes table t, which pipeline a (pipelines[0]) writes too"},
		{"rollups may share", head + pl("a", rollup("t")) + pl("b", rollup("public.T")), ""},
		{"other schema is another table", head + pl("a", upsert("t")) + pl("b", upsert("other.t")), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := loadConfig(t, tc.yaml)
			if err != nil {
				t.Fatal(err)
			}
			_, err = pipeline.Compile(cfg)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("err = %v, want none", err)
				}
				return
			}
			if !config.IsConfigError(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err =\n%v\nwant a configuration error containing\n%s", err, tc.want)
			}
		})
	}
}

// TestVersionConfiguration: upsert.version's keys are checked by Load and
// Compile, its column by Check, and the CREATE TABLE Check prints for a
// missing table has the version column.
func TestVersionConfiguration(t *testing.T) {
	const head = "kafka:\n  topics: [orders]\npipelines:\n  - name: a\n    topic: orders\n    format: json\n"
	cases := []struct{ name, upsert, want string }{
		{"version_column without version", "{table: t, key: {id: value.id}, columns: {s: value.s}, version_column: at}",
			`pipelines[0].upsert.version_column: "at" is not allowed (allowed: nothing without upsert.version`},
		{"version_column in the key", "{table: t, key: {id: value.id}, version: value.at, version_column: ID}",
			`pipelines[0].upsert.version_column: "ID" is not allowed (allowed: a column that is not part of upsert.key)`},
		{"version not a time or number", "{table: t, key: {id: value.id}, version: 'value.at == 1'}",
			`pipelines[0].upsert.version: "value.at == 1" is not allowed (allowed: a timestamp, an RFC 3339 string or a number`},
		{"version column written from another expression", "{table: t, key: {id: value.id}, columns: {at: value.b}, version: value.at, version_column: at}",
			`pipelines[0].upsert.columns.at: "value.b" is not allowed (allowed: the version's expression (value.at)`},
		{"unknown key", "{table: t, key: {id: value.id}, versoin: value.at}", "pipelines[0].upsert.versoin: unknown key (did you mean version?)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := loadConfig(t, head+"    upsert: "+tc.upsert+"\n")
			if err == nil {
				_, err = pipeline.Compile(cfg)
			}
			if !config.IsConfigError(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err =\n%v\nwant a configuration error containing\n%s", err, tc.want)
			}
		})
	}

	checks := []struct{ name, upsert, tables, want string }{
		{"no version column", "{table: t, key: {id: value.id}, columns: {s: value.s}, version: value.at}",
			"CREATE TABLE t (id text PRIMARY KEY, s text)", "pipelines[0].upsert.version: pipeline a: table t has no column version"},
		{"named column missing", "{table: t, key: {id: value.id}, version: value.at, version_column: seen}",
			"CREATE TABLE t (id text PRIMARY KEY, s text)", "pipelines[0].upsert.version_column: pipeline a: table t has no column seen"},
		{"version column of a text type", "{table: t, key: {id: value.id}, columns: {at: value.at}, version: value.at}",
			"CREATE TABLE t (id text PRIMARY KEY, at text)", "pipelines[0].upsert.columns.at: pipeline a: column at of t stores upsert.version and is text, not timestamptz or a number type"},
		{"create table", "{table: t, key: {id: value.id}, columns: {s: value.s}, version: int(value.seq)}",
			"", "version bigint"},
	}
	for _, tc := range checks {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := loadConfig(t, head+"    upsert: "+tc.upsert+"\n")
			if err != nil {
				t.Fatal(err)
			}
			set, err := pipeline.Compile(cfg)
			if err != nil {
				t.Fatal(err)
			}
			pool, err := pgxpool.New(t.Context(), testenv.Postgres(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			if tc.tables != "" {
				if _, err := pool.Exec(t.Context(), tc.tables); err != nil {
					t.Fatal(err)
				}
			}
			_, err = pipeline.Check(t.Context(), pool, set)
			var se *pipeline.SchemaError
			if !errors.As(err, &se) {
				t.Fatalf("err = %v, want a *SchemaError", err)
			}
			text := err.Error() + "\n" + strings.Join(se.CreateTables, "\n")
			if !strings.Contains(text, tc.want) {
				t.Fatalf("check:\n%s\nwant it to contain\n%s", text, tc.want)
			}
		})
	}
}

// TestTombstoneDeletesWhateverTheVersion: with on_tombstone: delete a
// tombstone deletes the row of any version, and a later record of an
// older version inserts it again.
func TestTombstoneDeletesWhateverTheVersion(t *testing.T) {
	yaml := "kafka:\n  topics: [orders]\npipelines:\n  - name: v\n    topic: orders\n    format: json\n" +
		"    upsert: {table: v, key: {id: string(record.key)}, columns: {s: value.s}, version: value.seq, on_tombstone: delete}\n"
	for _, split := range []bool{false, true} {
		t.Run(fmt.Sprintf("one batch %v", !split), func(t *testing.T) {
			pool, p := setup(t, yaml, "CREATE TABLE v (id text PRIMARY KEY, s text, version bigint)")
			recs := []processor.Record{rec(t, 0, "a", `{"s": "five", "seq": 5}`), rec(t, 1, "a", ""),
				rec(t, 2, "a", `{"s": "three", "seq": 3}`), rec(t, 3, "a", `{"s": "two", "seq": 2}`)}
			if split {
				for _, r := range recs {
					if err := apply(t, pool, p, r); err != nil {
						t.Fatal(err)
					}
				}
			} else if err := apply(t, pool, p, recs...); err != nil {
				t.Fatal(err)
			}
			assertRows(t, pool, `SELECT id||' '||s||' '||version FROM v`, "a three 3")
		})
	}
}
