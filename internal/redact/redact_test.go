package redact

import "testing"

func TestValues(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"cel string", `pipeline revenue: record orders[2]@1031: rollup.time: "soon" is not an RFC 3339 time`,
			`pipeline revenue: record orders[2]@1031: rollup.time: "…" is not an RFC 3339 time`},
		{"cel value", `pipeline orders: upsert.columns.at: the int 1796378577036 is not a timestamp (or an RFC 3339 string) for a timestamp with time zone column`,
			`pipeline orders: upsert.columns.at: the int … is not a timestamp (or an RFC 3339 string) for a timestamp with time zone column`},
		{"cel quoted value", `upsert.columns.n: the string "jane@example.com" is not an integer for a bigint column`,
			`upsert.columns.n: the string … is not an integer for a bigint column`},
		{"postgres value", `pipeline orders: upsert 1 rows of orders: ERROR: invalid input syntax for type numeric: "4111 1111 1111 1111" (SQLSTATE 22P02)`,
			`pipeline orders: upsert 1 rows of orders: ERROR: invalid input syntax for type numeric: "…" (SQLSTATE 22P02)`},
		{"postgres identifiers stay", `ERROR: new row for relation "test_ledger" violates check constraint "val_not_negative" (SQLSTATE 23514)`,
			`ERROR: new row for relation "test_ledger" violates check constraint "val_not_negative" (SQLSTATE 23514)`},
		{"key detail", `duplicate key value violates unique constraint "orders_pkey": Key (order_id)=(jane@example.com) already exists.`,
			`duplicate key value violates unique constraint "orders_pkey": Key (order_id)=(…) already exists.`},
		{"bare number", `rollup.aggregates.revenue: +Inf is not a finite number`, `rollup.aggregates.revenue: … is not a finite number`},
		{"epoch", `rollup.time: 99999999999999999 epoch milliseconds is out of range`, `rollup.time: … epoch milliseconds is out of range`},
		{"no value", `pipeline orders: record orders[0]@20: upsert.columns.amount: no such key: amout`,
			`pipeline orders: record orders[0]@20: upsert.columns.amount: no such key: amout`},
		{"escaped quote", `"a \"b\" c" is not an RFC 3339 time`, `"…" is not an RFC 3339 time`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Values(tt.in); got != tt.want {
				t.Errorf("Values(%q)\n = %q\nwant %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestAddresses(t *testing.T) {
	a := Addresses(`apply app_events[10] offsets 47..48: pipelines: pipeline orders: record app_events[10]@47: upsert.columns.amount: no such key: amout`)
	b := Addresses(`apply app_events[3] offsets 9..12: pipelines: pipeline orders: record app_events[3]@11: upsert.columns.amount: no such key: amout`)
	if a != b || a != "pipelines: pipeline orders: upsert.columns.amount: no such key: amout" {
		t.Errorf("Addresses: %q and %q, want both without the addresses", a, b)
	}
}
