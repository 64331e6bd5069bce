package pipeline_test

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"ratchet/internal/store"
	"ratchet/processor"
)

// timesYAML takes a time in three places: a rollup's time, a timestamptz
// column and a timestamp (without time zone) column of an upsert. The
// records' Kafka timestamps are 2026-12-01 09:00 (rec).
const timesYAML = `
kafka:
  topics: [orders]
pipelines:
  - name: seen
    topic: orders
    format: json
    upsert:
      table: seen
      key:     { id: string(record.key) }
      columns: { at: value.at, wall: value.wall, at3: value.at, wall3: value.wall }
  - name: per_minute
    topic: orders
    format: json
    rollup:
      table: per_minute
      time: value.ts
      bucket: 1m
      bucket_column: minute
      aggregates: { n: count }
`

const timesTables = `
CREATE TABLE seen (id text PRIMARY KEY, at timestamptz, wall timestamp, at3 timestamptz(3), wall3 timestamp(3));
CREATE TABLE per_minute (minute timestamptz PRIMARY KEY, n bigint);
`

const (
	seenRows = `SELECT id||' '||to_char(at AT TIME ZONE 'UTC','YYYY-MM-DD HH24:MI:SS.MS')||' '||to_char(wall,'YYYY-MM-DD HH24:MI:SS.MS')
	  ||coalesce(nullif(' '||to_char(at3 AT TIME ZONE 'UTC','YYYY-MM-DD HH24:MI:SS.MS'), ' '||to_char(at AT TIME ZONE 'UTC','YYYY-MM-DD HH24:MI:SS.MS')), '')
	  ||coalesce(nullif(' '||to_char(wall3,'YYYY-MM-DD HH24:MI:SS.MS'), ' '||to_char(wall,'YYYY-MM-DD HH24:MI:SS.MS')), '') FROM seen ORDER BY id`
	perMinuteRows = `SELECT to_char(minute AT TIME ZONE 'UTC','YYYY-MM-DD HH24:MI')||' '||n FROM per_minute ORDER BY minute`
)

// times is a record of timesYAML: ts for the rollup, at and wall for the
// upsert's columns (JSON literals).
func times(ts, at, wall string) string {
	return `{"ts":` + ts + `,"at":` + at + `,"wall":` + wall + `}`
}

// Every place that takes a time takes the same forms: a timestamp, RFC
// 3339 with or without fractional seconds, with Z or an offset, T or a
// space (PostgreSQL's output too), and epoch milliseconds as an int, a
// double or a string of digits.
func TestTimesAreReadAlikeEverywhere(t *testing.T) {
	cases := []struct{ name, json, want string }{
		{"epoch ms int", `1796115723456`, "2026-12-01 09:02:03.456"},
		{"epoch ms double", `1796115723456.0`, "2026-12-01 09:02:03.456"},
		{"epoch ms string", `"1796115723456"`, "2026-12-01 09:02:03.456"},
		{"rfc 3339", `"2026-12-01T09:02:03Z"`, "2026-12-01 09:02:03.000"},
		{"rfc 3339 fraction", `"2026-12-01T09:02:03.456Z"`, "2026-12-01 09:02:03.456"},
		{"offset", `"2026-12-01T10:02:03.456+01:00"`, "2026-12-01 09:02:03.456"},
		{"space", `"2026-12-01 09:02:03.456Z"`, "2026-12-01 09:02:03.456"},
		{"postgres output", `"2026-12-01 10:02:03.456+01"`, "2026-12-01 09:02:03.456"},
		{"backfill of old history", `1293872523456`, "2011-01-01 09:02:03.456"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pool, p := setup(t, timesYAML, timesTables)
			if err := apply(t, pool, p, rec(t, 0, "a", times(tc.json, tc.json, tc.json))); err != nil {
				t.Fatal(err)
			}
			assertRows(t, pool, seenRows, "a "+tc.want+" "+tc.want)
			assertRows(t, pool, perMinuteRows, tc.want[:16]+" 1")
		})
	}
	t.Run("timestamp", func(t *testing.T) {
		yaml := strings.NewReplacer("time: value.ts", "time: record.timestamp",
			"at: value.at", "at: record.timestamp", "wall: value.wall", "wall: record.timestamp",
			"at3: value.at", "at3: record.timestamp", "wall3: value.wall", "wall3: record.timestamp").Replace(timesYAML)
		pool, p := setup(t, yaml, timesTables)
		if err := apply(t, pool, p, rec(t, 3, "a", `{}`)); err != nil {
			t.Fatal(err)
		}
		assertRows(t, pool, seenRows, "a 2026-12-01 09:00:03.000 2026-12-01 09:00:03.000")
		assertRows(t, pool, perMinuteRows, "2026-12-01 09:00 1")
	})
	t.Run("timestamp column takes a time without a zone as it is", func(t *testing.T) {
		pool, p := setup(t, timesYAML, timesTables)
		if err := apply(t, pool, p, rec(t, 0, "a", times(`"2026-12-01T09:00:00Z"`, `null`, `"2026-12-01 11:00:00"`))); err != nil {
			t.Fatal(err)
		}
		assertRows(t, pool, `SELECT to_char(wall,'YYYY-MM-DD HH24:MI') FROM seen`, "2026-12-01 11:00")
	})
}

// A time that PostgreSQL cannot hold, or a number implausible as epoch
// milliseconds for its record (epoch seconds, microseconds, nanoseconds),
// is a record error naming the key path and the unit it probably is: it
// never lands in a wrong bucket. The error does not quote the value.
func TestImplausibleTimesAreRecordErrors(t *testing.T) {
	ok := `"2026-12-01T09:00:00Z"`
	cases := []struct{ name, value, want, digits string }{
		{"rollup epoch nanoseconds", times(`1796115600123456789`, ok, ok),
			"pipeline per_minute: record orders[0]@1: rollup.time: epoch milliseconds: beyond what a timestamptz holds (4713 BC to 294246 AD): epoch nanoseconds? divide by 1000000", "1796115600123"},
		{"rollup 5e16", times(`5e16`, ok, ok),
			"rollup.time: epoch milliseconds: beyond what a timestamptz holds", "5e16"},
		{"rollup epoch microseconds", times(`1796115600123456`, ok, ok),
			"rollup.time: epoch milliseconds: year 58886, more than 1d after the record's timestamp (epoch_millis_window.future): epoch microseconds? divide by 1000", "1796115600123"},
		{"rollup epoch seconds", times(`1796378577`, ok, ok),
			"rollup.time: epoch milliseconds: 1970-01-21, more than 7305d before the record's timestamp (epoch_millis_window.past): epoch seconds? multiply by 1000", "1796378577"},
		{"rollup epoch seconds as a string", times(`"1796378577"`, ok, ok),
			"rollup.time: epoch milliseconds: 1970-01-21, more than 7305d before", "1796378577"},
		{"rollup not a time", times(`"soon"`, ok, ok), "rollup.time: a string that is not an RFC 3339 time (2006-01-02T15:04:05Z) nor epoch milliseconds", "soon"},
		{"rollup a bool", times(`true`, ok, ok), "rollup.time: a bool is not a time (a timestamp, an RFC 3339 string or epoch milliseconds)", ""},
		{"rollup without a zone", times(`"2026-12-01T09:00:00"`, ok, ok),
			"rollup.time: a time without a zone: write Z or an offset", ""},
		{"timestamptz column epoch seconds", times(ok, `1796378577`, ok),
			"pipeline seen: record orders[0]@1: upsert.columns.at: for a timestamp with time zone column: epoch milliseconds: 1970-01-21, more than 7305d before the record's timestamp (epoch_millis_window.past): epoch seconds? multiply by 1000", "1796378577"},
		{"timestamptz column nanoseconds", times(ok, `1796115600123456789`, ok),
			"upsert.columns.at: for a timestamp with time zone column: epoch milliseconds: beyond what a timestamptz holds", "1796115600123"},
		{"timestamp column epoch seconds", times(ok, ok, `1796378577`),
			"upsert.columns.wall: for a timestamp without time zone column: epoch milliseconds: 1970-01-21, more than 7305d before", "1796378577"},
		{"timestamp column a day ahead and more", times(ok, ok, `1796288400001`),
			"upsert.columns.wall: for a timestamp without time zone column: epoch milliseconds: 2026-12-03, more than 1d after the record's timestamp", "1796288400001"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pool, p := setup(t, timesYAML, timesTables)
			err := apply(t, pool, p, rec(t, 0, "ok", times(ok, ok, ok)), rec(t, 1, "bad", tc.value))
			if !processor.IsPermanent(err) || !store.IsRecordError(err) {
				t.Fatalf("err = %v, want a permanent record error", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %q, want it to contain %q", err, tc.want)
			}
			if tc.digits != "" && strings.Contains(err.Error(), tc.digits) {
				t.Fatalf("err = %q quotes the record's value", err)
			}
			assertRows(t, pool, `SELECT count(*)::text FROM seen`, "0")
			assertRows(t, pool, `SELECT count(*)::text FROM per_minute`, "0")
		})
	}
}

// epoch_millis_window moves the bounds: a table of 1970s history can take
// its epoch milliseconds.
func TestEpochMillisWindowIsConfigurable(t *testing.T) {
	yaml := strings.Replace(timesYAML, "  - name: per_minute\n", "  - name: per_minute\n    epoch_millis_window: { past: 25000d, future: 36h }\n", 1)
	pool, p := setup(t, yaml, timesTables)
	// 1970-01-21 and 2026-12-02 10:00 (a day and an hour ahead).
	if err := apply(t, pool, p, rec(t, 0, "a", times(`1796378577`, `null`, `null`)), rec(t, 1, "b", times(`1796205600000`, `null`, `null`))); err != nil {
		t.Fatal(err)
	}
	assertRows(t, pool, perMinuteRows, "1970-01-21 18:59 1", "2026-12-02 10:00 1")
	// The upsert keeps the default window.
	err := apply(t, pool, p, rec(t, 2, "c", times(`"2026-12-01T09:00:00Z"`, `1796378577`, `null`)))
	if !processor.IsPermanent(err) || !strings.Contains(err.Error(), "upsert.columns.at: for a timestamp with time zone column: epoch milliseconds: 1970-01-21") {
		t.Fatalf("err = %v, want the upsert's record error", err)
	}
}

// The last time toTime accepts reaches PostgreSQL as itself: pgx's
// encoding does not overflow there (a record without a timestamp is
// checked against the range only).
func TestLastTimeReachesPostgres(t *testing.T) {
	pool, p := setup(t, timesYAML, timesTables)
	last := time.Unix(math.MaxInt64/1_000_000-1, 999_000_000).UTC()
	r := rec(t, 0, "a", times(`"2026-12-01T09:00:00Z"`, strconv.FormatInt(last.UnixMilli(), 10), `null`))
	r.Timestamp = time.Time{}
	if err := apply(t, pool, p, r); err != nil {
		t.Fatal(err)
	}
	assertRows(t, pool, `SELECT to_char(at AT TIME ZONE 'UTC','YYYY-MM-DD HH24:MI:SS.MS') FROM seen`, last.Format("2006-01-02 15:04:05.000"))
	r = rec(t, 1, "b", times(`"2026-12-01T09:00:00Z"`, strconv.FormatInt(last.UnixMilli()+1, 10), `null`))
	r.Timestamp = time.Time{}
	if err := apply(t, pool, p, r); !processor.IsPermanent(err) || !strings.Contains(err.Error(), "beyond what a timestamptz holds") {
		t.Fatalf("err = %v, want a record error", err)
	}
}
