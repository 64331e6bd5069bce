package pipeline_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"ratchet/processor"
	"ratchet/processor/pipeline"
)

// rejectingTx takes every record the processor rejects
// (processor.Rejecter).
type rejectingTx struct {
	pgx.Tx
	offsets []int64
	errs    []error
}

func (t *rejectingTx) Reject(offset int64, err error) bool {
	t.offsets, t.errs = append(t.offsets, offset), append(t.errs, err)
	return true
}

// TestRejectedRecordLeavesNothingInAnyPipeline: a record the second
// pipeline of its topic refuses is taken out of the batch: the first
// pipeline (a rollup, whose row the record merged into, with count, sum,
// min and max) keeps nothing of it, and the batch's other records are
// applied by both, as a batch without the record would be. Without a
// Rejecter the same batch fails with the same error.
func TestRejectedRecordLeavesNothingInAnyPipeline(t *testing.T) {
	const yaml = `
kafka:
  topics: [orders]
pipelines:
  - name: per_minute
    topic: orders
    format: json
    rollup:
      table: per_minute
      time: value.ts
      bucket: 1m
      bucket_column: minute
      group_by: { g: value.g }
      aggregates: { n: count, s: sum(double(value.v)), lo: min(double(value.v)), hi: max(double(value.v)) }
  - name: latest
    topic: orders
    format: json
    upsert:
      table: latest
      key:     { k: string(record.key) }
      columns: { x: int(value.x) }
`
	const tables = `
CREATE TABLE per_minute (g text NOT NULL, minute timestamptz NOT NULL, n bigint, s double precision, lo double precision, hi double precision, PRIMARY KEY (g, minute));
CREATE TABLE latest (k text PRIMARY KEY, x bigint);
`
	doc := func(g, v, x string) string {
		return `{"g": "` + g + `", "v": ` + v + `, "x": ` + x + `, "ts": "2026-12-01T09:00:10Z"}`
	}
	recs := func() []processor.Record {
		return []processor.Record{
			rec(t, 0, "k1", doc("a", "5", "1")),
			rec(t, 1, "k2", doc("a", "-100", `"abc"`)), // per_minute takes it (a new min), latest refuses it
			rec(t, 2, "k2", doc("b", "7", "2")),
			rec(t, 3, "k3", doc("c", "1", `"abc"`)), // a group of its own, refused as well
		}
	}
	const rollups = `SELECT g||' '||n||' '||s||' '||lo||' '||hi FROM per_minute ORDER BY g`
	const latest = `SELECT k||' '||x FROM latest ORDER BY k`

	pool, p := setup(t, yaml, tables)
	var rtx *rejectingTx
	b := processor.Batch{Topic: "orders", Start: 0, Next: 4, Records: recs()}
	if err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		rtx = &rejectingTx{Tx: tx}
		return p.Process(context.Background(), rtx, b)
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rtx.offsets, []int64{1, 3}) {
		t.Fatalf("rejected %v, want [1 3]", rtx.offsets)
	}
	var re *pipeline.RecordError
	if !errors.As(rtx.errs[0], &re) || re.Pipeline != "latest" || !processor.IsPermanent(rtx.errs[0]) {
		t.Fatalf("reason %v, want a permanent record error of latest", rtx.errs[0])
	}
	assertRows(t, pool, rollups, "a 1 5 5 5", "b 1 7 7 7")
	assertRows(t, pool, latest, "k1 1", "k2 2")

	// Without a Rejecter: the batch fails with the first refusal's error,
	// which is what the record alone fails with when split out.
	_, p2 := setup(t, yaml, tables)
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		return p2.Process(context.Background(), tx, processor.Batch{Topic: "orders", Start: 0, Next: 4, Records: recs()})
	})
	if err == nil || err.Error() != rtx.errs[0].Error() {
		t.Fatalf("without a Rejecter: %v, want %v", err, rtx.errs[0])
	}
}
