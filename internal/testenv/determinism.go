package testenv

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
)

// The determinism harness: one fixed stream of JSON records for upsert,
// rollup and append pipelines of one topic, with records PostgreSQL refuses in
// superseded positions and records ratchet refuses, and the tables and
// dead letters the stream must leave, computed without ratchet. The
// engine tests run it at several batch sizes, the crash tests with kill
// -9; every run must give the model's result.

// DeterminismYAML returns the configuration of the four pipelines
// reading topic: docs, the latest document per key (jsonb, numeric(5,2), a
// CHECK and varchar(8) columns, tombstones delete); per_group, a count and
// sum per group and minute; newest, per key the record of the highest
// version (upsert.version, versions shuffled); log, one row per record
// whose qty is not 4 (append, a varchar(6) column).
func DeterminismYAML(topic string) string {
	return `
kafka:
  topics: [` + topic + `]
pipelines:
  - name: docs
    topic: ` + topic + `
    format: json
    upsert:
      table: docs
      key:     { id: string(record.key) }
      columns: { body: value.body, price: value.price, qty: value.qty, code: value.code }
      on_tombstone: delete
  - name: per_group
    topic: ` + topic + `
    format: json
    rollup:
      table: per_group
      time: value.ts
      bucket: 1m
      bucket_column: minute
      group_by: { g: value.g }
      aggregates: { n: count, qty: sum(int(value.qty)) }
  - name: newest
    topic: ` + topic + `
    format: json
    upsert:
      table: newest
      key:     { id: string(record.key) }
      columns: { n: value.body.n }
      version: value.v
  - name: log
    topic: ` + topic + `
    format: json
    where: int(value.qty) != 4
    append:
      table: log
      columns: { part: record.partition, off: record.offset, k: string(record.key), qty: value.qty, tag: value.tag }
`
}

// DeterminismTables creates the pipelines' tables.
const DeterminismTables = `
CREATE TABLE docs (id text PRIMARY KEY, body jsonb, price numeric(5,2), qty integer CHECK (qty >= 0), code varchar(8));
CREATE TABLE per_group (g text NOT NULL, minute timestamptz NOT NULL, n bigint, qty bigint, PRIMARY KEY (g, minute));
CREATE TABLE newest (id text PRIMARY KEY, n text, version bigint);
CREATE TABLE log (part integer, off bigint, k text, qty integer, tag varchar(6));
`

// StreamRecord is one record of the determinism stream.
type StreamRecord struct {
	Partition int32
	Key       string
	Value     []byte // nil: a tombstone
	// Bad is what the dead letter's ratchet.error holds (an SQLSTATE or a
	// key path); empty for a record both pipelines apply.
	Bad string

	row     string // the docs row it leaves
	group   string // its per_group row's key
	qty     int
	version int // its newest version
	n       string
	offset  int64
	tag     string // its log row's tag
}

// DeterminismStream returns n records over 40 keys, a key always in one
// of partitions partitions, half of them on 3 hot keys (so that a batch of
// a few records holds several of one key): about 2 % carry a value
// PostgreSQL refuses (NUL in jsonb, numeric(5,2) overflow, the CHECK,
// varchar(8), log's varchar(6)), on a hot key, so mostly superseded by a later record of
// their key in the batch; about 2 % a value ratchet refuses (not JSON, a
// qty that is not an integer, a time per_group cannot read, a version
// newest cannot compare: the last two refused by a pipeline after others
// took the record); about 3 % are tombstones.
func DeterminismStream(n int, partitions int32) []StreamRecord {
	out := make([]StreamRecord, 0, n)
	next := map[int32]int64{}
	for i := range n {
		var r StreamRecord
		g, minute := []string{"a", "b", "c", "d"}[i%4], i/100
		r.qty = i % 9
		body, price, qty, code := fmt.Sprintf(`{"n": %d}`, i), fmt.Sprintf("%d.25", i%100), strconv.Itoa(r.qty), fmt.Sprintf(`"c%d"`, i)
		tag := fmt.Sprintf("t%d", i%1000)
		ts, version := fmt.Sprintf(`"2026-12-01T09:%02d:30Z"`, minute), ""
		tombstone := false
		switch {
		case i%197 == 11:
			body, r.Bad = `{"n": "a\u0000b"}`, "22P05"
		case i%199 == 13:
			price, r.Bad = "1234.5", "22003"
		case i%211 == 17:
			qty, r.Bad = "-1", "23514"
		case i%223 == 19:
			code, r.Bad = `"much too long"`, "22001"
		case i%227 == 23:
			qty, r.Bad = `"many"`, "upsert.columns.qty"
		case i%229 == 29:
			r.Value, r.Bad = []byte(`{"body": `), "json"
		case i%233 == 31 && r.qty != 4: // (where filters qty 4 out of log)
			tag, r.Bad = "longtag", "22001" // log refuses it alone
		case i%239 == 37:
			ts, r.Bad = `"the ninth hour"`, "rollup.time" // per_group refuses it, after docs took it
		case i%241 == 43:
			version, r.Bad = `"newer"`, "upsert.version" // newest refuses it, after docs and per_group took it
		case i%37 == 36:
			tombstone = true
		}
		k := 3 + i%37
		if i%2 == 0 || r.Bad != "" {
			k = i % 3
		}
		r.Partition, r.Key = int32(k)%partitions, fmt.Sprintf("k%02d", k)
		r.offset = next[r.Partition]
		next[r.Partition]++
		if tombstone || r.Value != nil {
			out = append(out, r)
			continue
		}
		r.version, r.n = i*37%101, strconv.Itoa(i)
		if version == "" {
			version = strconv.Itoa(r.version)
		}
		r.tag = tag
		r.Value = fmt.Appendf(nil, `{"body": %s, "price": %s, "qty": %s, "code": %s, "g": %q, "ts": %s, "v": %s, "tag": %q}`,
			body, price, qty, code, g, ts, version, tag)
		r.row = fmt.Sprintf(`%s {"n": %d} %s %d %s`, r.Key, i, price, r.qty, strings.Trim(code, `"`))
		r.group = fmt.Sprintf("%s 09:%02d", g, minute)
		out = append(out, r)
	}
	return out
}

// DeterminismModel returns what the stream must leave, computed without
// ratchet by applying the records one by one in order: the docs rows, the
// per_group rows, the newest rows (as DeterminismResult prints them) and
// the dead letters ("partition@offset", sorted).
func DeterminismModel(in []StreamRecord) (docs, groups, newest, dead []string) {
	rows := map[string]string{}
	latest := map[string]StreamRecord{}
	type agg struct{ n, qty int }
	aggs := map[string]*agg{}
	for _, r := range in {
		switch {
		case r.Bad != "":
			dead = append(dead, fmt.Sprintf("%d@%d", r.Partition, r.offset))
		case r.Value == nil:
			delete(rows, r.Key)
		default:
			rows[r.Key] = r.row
			if l, ok := latest[r.Key]; !ok || l.version <= r.version {
				latest[r.Key] = r
			}
			if aggs[r.group] == nil {
				aggs[r.group] = &agg{}
			}
			aggs[r.group].n++
			aggs[r.group].qty += r.qty
		}
	}
	for _, row := range rows {
		docs = append(docs, row)
	}
	for k, a := range aggs {
		groups = append(groups, fmt.Sprintf("%s %d %d", k, a.n, a.qty))
	}
	for k, r := range latest {
		newest = append(newest, fmt.Sprintf("%s %s %d", k, r.n, r.version))
	}
	slices.Sort(docs)
	slices.Sort(groups)
	slices.Sort(newest)
	slices.Sort(dead)
	return docs, groups, newest, dead
}

// DeterminismLogModel returns the log rows the stream must leave, as
// DeterminismLogResult prints them, sorted: one per record that is
// neither dead-lettered nor a tombstone and whose qty is not 4.
func DeterminismLogModel(in []StreamRecord) []string {
	var out []string
	for _, r := range in {
		if r.Bad != "" || r.Value == nil || r.qty == 4 {
			continue
		}
		out = append(out, fmt.Sprintf("%d %d %s %d %s", r.Partition, r.offset, r.Key, r.qty, r.tag))
	}
	slices.Sort(out)
	return out
}

// DeterminismLogResult reads the log table as DeterminismLogModel prints
// it, sorted.
func DeterminismLogResult(tb testing.TB, q Querier) []string {
	tb.Helper()
	rows, err := q.Query(context.Background(), `SELECT part||' '||off||' '||k||' '||qty||' '||tag FROM log`)
	if err != nil {
		tb.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		tb.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// Querier is what DeterminismResult reads the tables with (a pool or a
// connection).
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// DeterminismResult reads the docs, per_group and newest tables as
// DeterminismModel prints them.
func DeterminismResult(tb testing.TB, q Querier) (docs, groups, newest []string) {
	tb.Helper()
	read := func(sql string) []string {
		rows, err := q.Query(context.Background(), sql)
		if err != nil {
			tb.Fatal(err)
		}
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			tb.Fatal(err)
		}
		return out
	}
	return read(`SELECT id||' '||body::text||' '||price||' '||qty||' '||code FROM docs ORDER BY id`),
		read(`SELECT g||' '||to_char(minute AT TIME ZONE 'UTC','HH24:MI')||' '||n||' '||qty FROM per_group ORDER BY g, minute`),
		read(`SELECT id||' '||n||' '||version FROM newest ORDER BY id`)
}

// ProduceStream produces recs to topic, each to its partition, in order.
func ProduceStream(tb testing.TB, addr, topic string, recs []StreamRecord) {
	tb.Helper()
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": addr, "enable.idempotence": true, "acks": "all", "log_level": 3})
	if err != nil {
		tb.Fatal(err)
	}
	defer p.Close()
	deliveries := make(chan kafka.Event, len(recs))
	for _, r := range recs {
		m := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: r.Partition}, Key: []byte(r.Key), Value: r.Value}
		for {
			err := p.Produce(m, deliveries)
			if err == nil {
				break
			}
			p.Flush(50) // the local queue is full
		}
	}
	for range recs {
		ev := <-deliveries
		if m := ev.(*kafka.Message); m.TopicPartition.Error != nil {
			tb.Fatalf("produce: %v", m.TopicPartition.Error)
		}
	}
}

// DeadLetters reads every record of the dead-letter topic dlq once it
// holds want of them, and returns the records they stand for
// ("partition@offset", sorted) and the ratchet.error of each. More than
// want also returns, so a test sees a surplus.
func DeadLetters(tb testing.TB, addr, dlq string, want int) ([]string, map[string]string) {
	tb.Helper()
	var out []string
	why := map[string]string{}
	readDeadLetters(tb, addr, dlq, want, func(m *kafka.Message) {
		h := map[string]string{}
		for _, x := range m.Headers {
			h[x.Key] = string(x.Value)
		}
		id := h["ratchet.partition"] + "@" + h["ratchet.offset"]
		out = append(out, id)
		why[id] = h["ratchet.error"]
	})
	slices.Sort(out)
	return out, why
}

// DeadLetterRecords reads the dead-letter topic dlq as DeadLetters does
// and returns each record, by "partition@offset" of its original, as its
// key, value and headers in order, but for the headers that differ from
// run to run (ratchet.failed_at, traceparent). A record written twice
// (dead letters are at-least-once) appears once when both copies are the
// same, and as both otherwise.
func DeadLetterRecords(tb testing.TB, addr, dlq string, want int) map[string]string {
	tb.Helper()
	out := map[string]string{}
	readDeadLetters(tb, addr, dlq, want, func(m *kafka.Message) {
		var b strings.Builder
		fmt.Fprintf(&b, "key=%q value=%q", m.Key, m.Value)
		var id [2]string
		for _, h := range m.Headers {
			switch h.Key {
			case "ratchet.failed_at", "traceparent":
				continue
			case "ratchet.partition":
				id[0] = string(h.Value)
			case "ratchet.offset":
				id[1] = string(h.Value)
			}
			fmt.Fprintf(&b, " %s=%q", h.Key, h.Value)
		}
		k := id[0] + "@" + id[1]
		if prev, ok := out[k]; ok && prev != b.String() {
			out[k] = prev + "\n" + b.String()
			return
		}
		out[k] = b.String()
	})
	return out
}

// readDeadLetters waits until dlq holds want records, then hands each of
// its records to each.
func readDeadLetters(tb testing.TB, addr, dlq string, want int, each func(*kafka.Message)) {
	tb.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": addr, "group.id": "dead-letter-reader", "log_level": 3})
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	var parts []kafka.TopicPartition
	var total int64
	Eventually(tb, 90*time.Second, func() bool {
		md, err := c.GetMetadata(&dlq, false, 5000)
		if err != nil || len(md.Topics[dlq].Partitions) == 0 {
			return false
		}
		parts, total = parts[:0], 0
		for _, p := range md.Topics[dlq].Partitions {
			_, high, err := c.QueryWatermarkOffsets(dlq, p.ID, 5000)
			if err != nil {
				return false
			}
			parts = append(parts, kafka.TopicPartition{Topic: &dlq, Partition: p.ID, Offset: kafka.OffsetBeginning})
			total += high
		}
		return total >= int64(want)
	}, "%d records in %s", want, dlq)
	if err := c.Assign(parts); err != nil {
		tb.Fatal(err)
	}
	var n int64
	deadline := time.Now().Add(60 * time.Second)
	for n < total && time.Now().Before(deadline) {
		m, err := c.ReadMessage(time.Second)
		if err != nil {
			continue
		}
		n++
		each(m)
	}
}
