package pipeline

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"ratchet/internal/testenv"
)

// TestKeyOfFollowsTheColumnsEquality: values the column holds as equal
// render one key; values it tells apart render two.
func TestKeyOfFollowsTheColumnsEquality(t *testing.T) {
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	cases := []struct {
		name  string
		typ   string
		a, b  any
		equal bool
	}{
		{"float zero and minus zero", "double precision", 0.0, math.Copysign(0, -1), true},
		{"NaNs", "double precision", math.NaN(), -math.NaN(), true},
		{"floats apart", "double precision", 0.1, 0.10000000001, false},
		{"real rounds", "real", 0.1, 0.10000000001, true},
		{"times under a microsecond apart", "timestamp with time zone", at.Add(100), at.Add(999), true},
		{"times a microsecond apart", "timestamp with time zone", at.Add(999), at.Add(1000), false},
		{"times before 1970 floor too", "timestamp with time zone", time.Unix(-1, 100), time.Unix(-1, 900), true},
		{"numeric spellings", "numeric", "1", " 1.0e0 ", true},
		{"numeric apart", "numeric", "1", "1.0000001", false},
		{"numeric scale rounds half away from zero", "numeric(5,2)", "-1.005", "-1.01", true},
		{"numeric scale keeps apart", "numeric(5,2)", "1.004", "1.006", false},
		{"numeric NaN", "numeric", "NaN", "nan", true},
		{"uuid spellings", "uuid", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "{A0EEBC999C0B4EF8BB6D6BB9BD380A11}", true},
		{"uuids apart", "uuid", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12", false},
		{"bpchar padding", "character(4)", "ab", "ab  ", true},
		{"varchar keeps spaces that fit", "character varying(4)", "ab", "ab  ", false},
		{"varchar drops excess spaces", "character varying(2)", "ab", "ab   ", true},
		{"varchar too long is not cut", "character varying(2)", "ab", "abc", false},
		{"text exact", "text", "ab", "ab ", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := wireOf(tc.typ)
			a, b := string(keyOf(nil, tc.a, k, tc.typ)), string(keyOf(nil, tc.b, k, tc.typ))
			if (a == b) != tc.equal {
				t.Fatalf("keys %q and %q: equal %v, want %v", a, b, a == b, tc.equal)
			}
		})
	}
}

// TestColumnsReachPostgreSQLAsPlainArrays: a column built by column()
// arrives as the same array pgx sends for a plain slice of its values, in
// every query exec mode a postgres.url may name (simple_protocol sends
// text), NULLs and values that need quoting in text included.
func TestColumnsReachPostgreSQLAsPlainArrays(t *testing.T) {
	at := time.Date(2026, 12, 1, 9, 0, 0, 123456789, time.FixedZone("x", 5400))
	cols := []struct {
		kind wireKind
		vals []any
		// plain is what pgx's own path receives: a []T, or a []*T with NULLs
		plain any
	}{
		{wireString, []any{"a", "", `q"u,o{t}e\`, "ünï"}, []string{"a", "", `q"u,o{t}e\`, "ünï"}},
		{wireText, []any{"1.50", nil, "NaN"}, []*string{ptr("1.50"), nil, ptr("NaN")}},
		{wireInt, []any{int64(0), int64(math.MinInt64), int64(math.MaxInt64)}, []int64{0, math.MinInt64, math.MaxInt64}},
		{wireFloat, []any{0.1, math.Copysign(0, -1), math.Inf(1), -1e300}, []float64{0.1, math.Copysign(0, -1), math.Inf(1), -1e300}},
		{wireTime, []any{at, time.Unix(-1, 999), time.Time{}}, []time.Time{at, time.Unix(-1, 999), {}}},
		{wireBool, []any{true, false}, []bool{true, false}},
	}
	ctx := context.Background()
	url := testenv.Postgres(t)
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		conn, err := pgx.Connect(ctx, url+"&default_query_exec_mode="+mode)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cols {
			stmt := fmt.Sprintf("SELECT coalesce(u::text, 'NULL') FROM unnest($1::%s) WITH ORDINALITY AS t(u, o) ORDER BY o", c.kind.arrayType())
			read := func(arg any) []string {
				rows, err := conn.Query(ctx, stmt, arg)
				if err != nil {
					t.Fatalf("%s, %s: %v", mode, c.kind.arrayType(), err)
				}
				out, err := pgx.CollectRows(rows, pgx.RowTo[string])
				if err != nil {
					t.Fatalf("%s, %s: %v", mode, c.kind.arrayType(), err)
				}
				return out
			}
			got := read(column(c.kind, len(c.vals), func(j int) any { return c.vals[j] }))
			want := read(c.plain)
			if !slices.Equal(got, want) || len(got) != len(c.vals) {
				t.Errorf("%s, %s: column() arrived as %q, a plain slice as %q", mode, c.kind.arrayType(), got, want)
			}
		}
		conn.Close(ctx)
	}
}

// TestColumnsEncodeWithoutAnAllocationPerValue: pgx encodes a column
// without NULLs in a fixed number of allocations, however many values it
// holds (a plain slice costs one per value).
func TestColumnsEncodeWithoutAnAllocationPerValue(t *testing.T) {
	m := pgtype.NewMap()
	const n = 1000
	texts, ints, floats, times := make([]any, n), make([]any, n), make([]any, n), make([]any, n)
	for i := range n {
		texts[i], ints[i], floats[i], times[i] = fmt.Sprint("v", i), int64(i), float64(i)/3, time.Unix(int64(i), 0)
	}
	for _, c := range []struct {
		kind wireKind
		oid  uint32
		vals []any
	}{
		{wireString, pgtype.TextArrayOID, texts},
		{wireInt, pgtype.Int8ArrayOID, ints},
		{wireFloat, pgtype.Float8ArrayOID, floats},
		{wireTime, pgtype.TimestamptzArrayOID, times},
	} {
		arr := column(c.kind, n, func(j int) any { return c.vals[j] })
		buf := make([]byte, 0, 64<<10)
		encode := func() {
			var err error
			if buf, err = m.Encode(c.oid, pgtype.BinaryFormatCode, arr, buf[:0]); err != nil {
				t.Fatal(err)
			}
		}
		encode() // plans cached
		if allocs := testing.AllocsPerRun(20, encode); allocs > 10 {
			t.Errorf("%s: %.0f allocations to encode %d values", c.kind.arrayType(), allocs, n)
		}
	}
}

func ptr[T any](v T) *T { return &v }
