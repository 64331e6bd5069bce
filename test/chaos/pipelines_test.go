package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/internal/chaos"
)

// The JSON topic of a run that draws pipelines (chaos.Schedule.Pipelines),
// and its dead-letter topic (kafka.dlq_topic is empty: `<topic>.dlq`).
const (
	ordersTopic = "orders"
	ordersDLQ   = "orders.dlq"
	// ordersRate is the JSON topic's records a second, beside the
	// event load.
	ordersRate = 40
	// ordersKeys is how many keys the JSON records spread over: few
	// enough that every key is updated, deleted and written again many
	// times, often within one batch.
	ordersKeys = 150
)

// pipelinesConfig is the members' configuration file in a pipeline run:
// the built-in dashboard as a pipeline on the event topic, and an upsert
// and a rollup on the JSON topic.
const pipelinesConfig = `
kafka:
  topics: [events, orders]
pipelines:
  - name: dashboard
    topic: events
    format: event
    rollup:
      table: dashboard_rollups
      time: value.time
      bucket: 1m
      bucket_column: bucket
      group_by: { metric: value.metric }
      aggregates: { count: count, sum: sum(value.value), min: min(value.value), max: max(value.value) }
  - name: orders_latest
    topic: orders
    format: json
    upsert:
      table: chaos_orders
      key: { id: string(record.key) }
      columns: { seq: value.seq, customer: value.customer, amount: value.amount, price: value.price, note: value.note, at: value.ts }
      on_tombstone: delete
  - name: orders_per_minute
    topic: orders
    format: json
    rollup:
      table: chaos_orders_per_minute
      time: value.ts
      bucket: 1m
      bucket_column: minute
      group_by: { region: value.region }
      aggregates: { n: count, total: sum(value.amount) }
`

// pipelinesTables are the pipelines' tables, which belong to the user:
// the explorer creates them before the members start.
const pipelinesTables = `
CREATE TABLE chaos_orders (id text PRIMARY KEY, seq bigint NOT NULL, customer varchar(16), amount bigint,
	price numeric(8,2), note jsonb, at timestamptz);
CREATE TABLE chaos_orders_per_minute (region text, minute timestamptz, n bigint, total bigint, PRIMARY KEY (region, minute));`

// orderKind is what a JSON record is: good, a tombstone, or bad in one
// of the ways real producers get it wrong.
type orderKind int

const (
	orderGood orderKind = iota
	orderTombstone
	orderNotJSON      // poison before any pipeline sees it
	orderMissingField // no amount
	orderWrongType    // amount is a bool
	orderStringNumber // amount is a string that is no number
	orderNUL          // a NUL in the note, which a jsonb column refuses
	orderTooLong      // a customer longer than varchar(16)
	orderOverflow     // a price that numeric(8,2) cannot hold
	orderBadTime      // an event time past what timestamptz holds
	orderKinds
)

var orderKindNames = [orderKinds]string{"good", "tombstone", "not JSON", "missing field", "wrong type",
	"string for a number", "NUL in jsonb", "too long for varchar(16)", "numeric overflow", "time out of range"}

func (k orderKind) String() string { return orderKindNames[k] }

// certain reports whether every pipeline run refuses a record of kind k
// whatever else its batch holds: ratchet itself refuses it (it does not
// decode, an expression fails on it, it does not convert to its column).
// The others are refused by PostgreSQL only when their version of the row
// reaches it: a later record of the same key in the batch may replace it
// first.
func (k orderKind) certain() bool {
	switch k {
	case orderNotJSON, orderMissingField, orderWrongType, orderStringNumber, orderBadTime:
		return true
	}
	return false
}

// order is one JSON record the producer wrote, as its delivery report
// told.
type order struct {
	partition int32
	offset    int64
	key       string
	kind      orderKind
	seq       int64
	amount    int64
	region    string
	minute    time.Time
}

// orderRow is what the model expects of chaos_orders for one key.
type orderRow struct {
	seq    int64
	amount int64
}

type regionMinute struct {
	region string
	minute time.Time
}

// nextOrder draws the JSON topic's next record from rng: its key, its
// value (nil for a tombstone) and what the model needs to know of it.
func nextOrder(rng *rand.Rand, seq int64) ([]byte, []byte, order) {
	key := fmt.Sprintf("o%d", rng.IntN(ordersKeys))
	o := order{key: key, seq: seq, kind: orderGood}
	switch n := rng.IntN(100); {
	case n < 80:
	case n < 85:
		o.kind = orderTombstone
	default:
		o.kind = orderKind(int(orderNotJSON) + rng.IntN(int(orderKinds-orderNotJSON)))
	}
	if o.kind == orderTombstone {
		return []byte(key), nil, o
	}
	o.amount = int64(1 + rng.IntN(1000))
	o.region = []string{"eu", "us", "apac", "latam"}[rng.IntN(4)]
	ts := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(rng.Int64N(int64(24 * time.Hour))))
	o.minute = ts.Truncate(time.Minute)
	v := map[string]any{
		"seq": seq, "customer": fmt.Sprintf("c%d", rng.IntN(1000)), "amount": o.amount,
		"price": float64(rng.IntN(100000)) / 100, "region": o.region, "ts": ts.Format(time.RFC3339Nano),
		"note": map[string]any{"channel": []string{"web", "shop", "phone"}[rng.IntN(3)]},
	}
	switch o.kind {
	case orderNotJSON:
		return []byte(key), fmt.Appendf(nil, `{"seq": %d, "amount": `, seq), o
	case orderMissingField:
		delete(v, "amount")
	case orderWrongType:
		v["amount"] = true
	case orderStringNumber:
		v["amount"] = "twelve"
	case orderNUL:
		v["note"] = map[string]any{"channel": "we\u0000b"}
	case orderTooLong:
		v["customer"] = strings.Repeat("customer", 5)
	case orderOverflow:
		v["price"] = 123456789.5
	case orderBadTime:
		v["ts"] = int64(1) << 62 // epoch milliseconds some 146 million years on
	}
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return []byte(key), b, o
}

// setUpPipelines writes the members' configuration file and creates the
// pipelines' tables.
func (r *run) setUpPipelines() {
	r.configPath = filepath.Join(r.dir, "pipelines.yaml")
	if err := os.WriteFile(r.configPath, []byte(pipelinesConfig), 0o600); err != nil {
		r.t.Fatal(err)
	}
	if _, err := r.pool.Exec(context.Background(), pipelinesTables); err != nil {
		r.t.Fatalf("create the pipelines' tables: %v", err)
	}
}

// produceOrders writes the JSON topic for the length of the load,
// ordersRate records a second, keyed (a key maps to one partition, so
// offsets order its versions), drawn from a stream of their own.
func (r *run) produceOrders() {
	rng := rand.New(rand.NewPCG(r.s.Seed, 0x6f72646572732121)) // "orders!!"
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": r.addr, "linger.ms": 5,
		"enable.idempotence": true, "acks": "all", "log_level": 3})
	if err != nil {
		r.violate("orders producer: %v", err)
		return
	}
	defer p.Close()
	deliveries := make(chan kafka.Event, 1024)
	var drained sync.WaitGroup
	drained.Go(func() { // ends when deliveries is closed
		for e := range deliveries {
			m, ok := e.(*kafka.Message)
			if !ok {
				continue
			}
			o := m.Opaque.(order)
			r.mu.Lock()
			if m.TopicPartition.Error != nil {
				r.failedOrders++
			} else {
				o.partition, o.offset = m.TopicPartition.Partition, int64(m.TopicPartition.Offset)
				r.orders = append(r.orders, o)
			}
			r.mu.Unlock()
		}
	})
	t := ordersTopic
	ticker := time.NewTicker(time.Second / ordersRate) // pacing of the load
	defer ticker.Stop()
	end := r.start.Add(r.s.Load)
	sent := 0
	for now := range ticker.C {
		if now.After(end) {
			break
		}
		k, v, o := nextOrder(rng, int64(sent))
		for p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &t, Partition: kafka.PartitionAny},
			Key: k, Value: v, Opaque: o}, deliveries) != nil {
			p.Flush(50)
		}
		sent++
	}
	for p.Flush(1000) > 0 {
	}
	for { // every record has its delivery report once Flush returns 0
		r.mu.Lock()
		got := len(r.orders) + r.failedOrders
		r.mu.Unlock()
		if got >= sent {
			break
		}
		time.Sleep(10 * time.Millisecond) // the reports in the channel are being read
	}
	close(deliveries)
	drained.Wait()
	r.note("orders producer done: %d records, %d failed deliveries", sent, r.failedOrders)
}

// ordersCaughtUp reports whether the group has applied the JSON topic to
// its end: the stored position (exactly-once) or Kafka's committed offset
// (at-least-once, which commits only what is applied) of every partition
// is at its high watermark. Dead letters are durable before the position
// passes them, so the dead-letter topic is complete too.
func (r *run) ordersCaughtUp() bool {
	stored := map[int32]int64{}
	if r.s.Mode == chaos.ExactlyOnce {
		rows, err := r.pool.Query(context.Background(), `SELECT partition, next_offset FROM ratchet_offsets WHERE consumer_group = $1 AND topic = $2`, group, ordersTopic)
		if err != nil {
			return false
		}
		for rows.Next() {
			var p int32
			var n int64
			if rows.Scan(&p, &n) == nil {
				stored[p] = n
			}
		}
		rows.Close()
	} else if info := r.cluster.GroupInfo(group); info != nil {
		for p, c := range info.Commits[ordersTopic] {
			stored[p] = c.Offset
		}
	}
	for _, p := range r.cluster.PartitionInfos(ordersTopic) {
		if p.HighWatermark > p.LogStartOffset && stored[p.Partition] < p.HighWatermark {
			return false
		}
	}
	return true
}

// orderDeadLetters reads the JSON topic's dead-letter topic: the records
// (partition, offset) it holds, each once however often it was written.
func (r *run) orderDeadLetters() (map[[2]int64]bool, error) {
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": r.addr, "group.id": "chaos-orders-dlq-reader",
		"enable.auto.commit": false, "log_level": 3})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	var tps []kafka.TopicPartition
	want := int64(0)
	t := ordersDLQ
	for _, p := range r.cluster.PartitionInfos(ordersDLQ) {
		tps = append(tps, kafka.TopicPartition{Topic: &t, Partition: p.Partition, Offset: kafka.OffsetBeginning})
		want += p.HighWatermark - p.LogStartOffset
	}
	if err := c.Assign(tps); err != nil {
		return nil, err
	}
	got := map[[2]int64]bool{}
	deadline := time.Now().Add(30 * time.Second)
	n := int64(0)
	for n < want && time.Now().Before(deadline) {
		m, err := c.ReadMessage(time.Second)
		if err != nil {
			continue
		}
		n++
		var src [2]int64
		from := ""
		for _, h := range m.Headers {
			switch h.Key {
			case "ratchet.topic":
				from = string(h.Value)
			case "ratchet.partition":
				src[0], _ = strconv.ParseInt(string(h.Value), 10, 64)
			case "ratchet.offset":
				src[1], _ = strconv.ParseInt(string(h.Value), 10, 64)
			}
		}
		if from != ordersTopic {
			return nil, fmt.Errorf("%s holds a dead letter of topic %q", ordersDLQ, from)
		}
		got[src] = true
	}
	if n < want {
		return nil, fmt.Errorf("read %d of the %d dead letters of %s in 30s", n, want, ordersDLQ)
	}
	return got, nil
}

// orderModel is what the pipelines' tables must hold given the records
// that were not dead-lettered: the upsert's row per key is its last such
// record by offset (keys stay on one partition), a tombstone deleting it;
// the rollup counts and sums every such record that is not a tombstone.
func (r *run) orderModel(dead map[[2]int64]bool) (map[string]orderRow, map[regionMinute]agg) {
	r.mu.Lock()
	orders := append([]order(nil), r.orders...)
	r.mu.Unlock()
	type last struct {
		offset int64
		o      order
	}
	latest := map[string]last{}
	rollup := map[regionMinute]agg{}
	for _, o := range orders {
		if dead[[2]int64{int64(o.partition), o.offset}] {
			continue
		}
		if l, ok := latest[o.key]; !ok || o.offset > l.offset {
			latest[o.key] = last{o.offset, o}
		}
		if o.kind == orderTombstone {
			continue
		}
		k := regionMinute{o.region, o.minute}
		a := rollup[k]
		a.count++
		a.sum += float64(o.amount)
		rollup[k] = a
	}
	rows := map[string]orderRow{}
	for k, l := range latest {
		if l.o.kind != orderTombstone {
			rows[k] = orderRow{seq: l.o.seq, amount: l.o.amount}
		}
	}
	return rows, rollup
}

// checkPipelines checks, after the final stop, the invariant of the
// pipeline run: each table equals the model of the JSON records that were
// not dead-lettered (rollups exactly in exactly-once mode; in at-least-once
// mode never short, with no more replayed than the members announced or
// could not announce); what was dead-lettered is bad, and what ratchet
// itself refuses is always dead-lettered.
func (r *run) checkPipelines() {
	ctx := context.Background()
	dead, err := r.orderDeadLetters()
	if err != nil {
		r.violate("orders dead letters: %v", err)
		return
	}
	r.mu.Lock()
	byPos := map[[2]int64]order{}
	for _, o := range r.orders {
		byPos[[2]int64{int64(o.partition), o.offset}] = o
	}
	r.mu.Unlock()
	kinds := map[orderKind][2]int{} // dead-lettered, produced
	var wrong, kept []string
	for _, o := range byPos {
		pos := [2]int64{int64(o.partition), o.offset}
		c := kinds[o.kind]
		c[1]++
		if dead[pos] {
			c[0]++
		}
		kinds[o.kind] = c
		switch {
		case dead[pos] && (o.kind == orderGood || o.kind == orderTombstone):
			wrong = append(wrong, fmt.Sprintf("%d@%d (%s)", o.partition, o.offset, o.kind))
		case !dead[pos] && o.kind.certain():
			kept = append(kept, fmt.Sprintf("%d@%d (%s)", o.partition, o.offset, o.kind))
		}
	}
	for pos := range dead {
		if _, ok := byPos[pos]; !ok {
			wrong = append(wrong, fmt.Sprintf("%d@%d (not produced)", pos[0], pos[1]))
		}
	}
	var summary []string
	for k := range orderKinds {
		summary = append(summary, fmt.Sprintf("%s %d/%d", k, kinds[k][0], kinds[k][1]))
	}
	r.note("orders dead-lettered per kind (dead/produced): %s", strings.Join(summary, ", "))
	if len(wrong) > 0 {
		r.violate("orders: %d records dead-lettered that are not bad: %v", len(wrong), first(wrong, 10))
	}
	if len(kept) > 0 {
		r.violate("orders: %d records that no pipeline can apply were not dead-lettered: %v", len(kept), first(kept, 10))
	}
	if r.s.Mode == chaos.ExactlyOnce {
		r.checkOrderDeadLetterRows(dead)
	}

	wantRows, wantRollup := r.orderModel(dead)
	gotRows := map[string]orderRow{}
	rows, err := r.pool.Query(ctx, `SELECT id, seq, amount FROM chaos_orders`)
	if err != nil {
		r.violate("read chaos_orders: %v", err)
		return
	}
	for rows.Next() {
		var id string
		var row orderRow
		if err := rows.Scan(&id, &row.seq, &row.amount); err != nil {
			r.violate("read chaos_orders: %v", err)
			rows.Close()
			return
		}
		gotRows[id] = row
	}
	rows.Close()
	var off []string
	for k, w := range wantRows {
		if g, ok := gotRows[k]; !ok {
			off = append(off, fmt.Sprintf("%s missing (want seq %d)", k, w.seq))
		} else if g != w {
			off = append(off, fmt.Sprintf("%s seq %d amount %d, want seq %d amount %d", k, g.seq, g.amount, w.seq, w.amount))
		}
	}
	for k, g := range gotRows {
		if _, ok := wantRows[k]; !ok {
			off = append(off, fmt.Sprintf("%s seq %d: a row the model deleted or never had", k, g.seq))
		}
	}
	if len(off) > 0 {
		r.violate("upsert chaos_orders: %d of %d keys differ from the model of the records not dead-lettered: %v", len(off), len(wantRows), first(off, 5))
	}

	gotRollup := map[regionMinute]agg{}
	rows, err = r.pool.Query(ctx, `SELECT region, minute, n, total FROM chaos_orders_per_minute`)
	if err != nil {
		r.violate("read chaos_orders_per_minute: %v", err)
		return
	}
	for rows.Next() {
		var k regionMinute
		var a agg
		var total int64
		if err := rows.Scan(&k.region, &k.minute, &a.count, &total); err != nil {
			r.violate("read chaos_orders_per_minute: %v", err)
			rows.Close()
			return
		}
		k.minute = k.minute.UTC()
		a.sum = float64(total)
		gotRollup[k] = a
	}
	rows.Close()
	exact := r.s.Mode == chaos.ExactlyOnce
	var wantTotal, gotTotal int64
	var lost, doubled []string
	for k, w := range wantRollup {
		g := gotRollup[k]
		wantTotal += w.count
		switch {
		case g.count < w.count || g.sum < w.sum:
			lost = append(lost, fmt.Sprintf("%s@%s %d/%.0f < %d/%.0f", k.region, k.minute.Format("15:04"), g.count, g.sum, w.count, w.sum))
		case exact && (g.count != w.count || g.sum != w.sum):
			doubled = append(doubled, fmt.Sprintf("%s@%s %d/%.0f, want %d/%.0f", k.region, k.minute.Format("15:04"), g.count, g.sum, w.count, w.sum))
		}
	}
	for k, g := range gotRollup {
		gotTotal += g.count
		if _, ok := wantRollup[k]; !ok {
			doubled = append(doubled, fmt.Sprintf("%s@%s: a bucket no record makes (count %d)", k.region, k.minute.Format("15:04"), g.count))
		}
	}
	if len(lost) > 0 {
		r.violate("rollup chaos_orders_per_minute: %d buckets short (%d counted, %d due): %v", len(lost), gotTotal, wantTotal, first(lost, 5))
	}
	if exact && len(doubled) > 0 {
		r.violate("rollup chaos_orders_per_minute, exactly-once: %d buckets off (%d counted, %d due): %v", len(doubled), gotTotal, wantTotal, first(doubled, 5))
	}
	if !exact {
		announced := r.announcedReplays()
		r.mu.Lock()
		allowance := r.silentBound
		r.mu.Unlock()
		if replayed := gotTotal - wantTotal; replayed > announced+allowance {
			r.violate("rollup chaos_orders_per_minute, at-least-once: %d records replayed, %d announced (+%d allowed for %d silent losses)", replayed, announced, allowance, r.silentLosses)
		} else {
			r.note("orders rollup, at-least-once: %d replayed, %d announced, %d allowed", replayed, announced, allowance)
		}
	}
	r.note("orders: %d keys in the upsert, %d rollup buckets, %d dead letters", len(wantRows), len(wantRollup), len(dead))
}

// checkOrderDeadLetterRows compares, in exactly-once mode, the JSON
// topic's rows of ratchet_dead_letters (written in the transactions that
// pass the records) with its dead-letter topic: the same records.
func (r *run) checkOrderDeadLetterRows(dead map[[2]int64]bool) {
	rows, err := r.pool.Query(context.Background(), `SELECT partition, "offset" FROM ratchet_dead_letters WHERE consumer_group = $1 AND topic = $2`, group, ordersTopic)
	if err != nil {
		r.violate("read ratchet_dead_letters: %v", err)
		return
	}
	defer rows.Close()
	seen := map[[2]int64]bool{}
	var extra, missing []string
	for rows.Next() {
		var k [2]int64
		if err := rows.Scan(&k[0], &k[1]); err != nil {
			r.violate("read ratchet_dead_letters: %v", err)
			return
		}
		seen[k] = true
		if !dead[k] {
			extra = append(extra, fmt.Sprintf("%d@%d", k[0], k[1]))
		}
	}
	for k := range dead {
		if !seen[k] {
			missing = append(missing, fmt.Sprintf("%d@%d", k[0], k[1]))
		}
	}
	if len(missing) > 0 || len(extra) > 0 {
		r.violate("ratchet_dead_letters of %s: %d dead letters without a row %v, %d rows without a dead letter %v",
			ordersTopic, len(missing), first(missing, 10), len(extra), first(extra, 10))
	}
}
