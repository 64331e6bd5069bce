package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/store"
	"ratchet/internal/testenv"
	"ratchet/processor"
	"ratchet/processor/pipeline"
)

// The backfill tests produce JSON orders to a kfake topic, apply the
// records from each partition's origin on ("live") with the pipelines'
// own processor and store path while more are produced, record the
// origins as `ratchet run` does, and backfill the history before them;
// every table is then compared with a model of all records applied once.

const bfTopic = "orders"

const backfillYAML = `
kafka:
  topics: [orders]
  group_id: bf-test
processing:
  batch_size: 40
pipelines:
  - name: per_minute
    topic: orders
    format: json
    rollup:
      table: per_minute
      time: value.ts
      bucket: 1m
      bucket_column: minute
      group_by: { country: value.country }
      aggregates: { n: count, total: sum(double(value.amount)), lo: min(double(value.amount)), hi: max(double(value.amount)) }
  - name: latest
    topic: orders
    format: json
    upsert:
      table: latest
      key: { id: value.id }
      columns: { amount: double(value.amount) }
      version: int(value.v)
      version_column: v
`

const backfillTables = `
CREATE TABLE per_minute (country text, minute timestamptz, n bigint, total double precision, lo double precision,
  hi double precision, PRIMARY KEY (country, minute));
CREATE TABLE latest (id text PRIMARY KEY, amount double precision, v bigint);
`

// bfOrder is one produced record.
type bfOrder struct {
	ID      string  `json:"id"`
	V       int64   `json:"v"`
	Country string  `json:"country"`
	Amount  float64 `json:"amount"`
	TS      string  `json:"ts"`
	bad     bool    // amount is not a number: every pipeline refuses it
	part    int32
	off     int64
}

type backfillEnv struct {
	db, addr, path string
	pool           *pgxpool.Pool
	cfg            config.Config
	prod           *kafka.Producer
	rng            *rand.Rand
	// version makes each order's version unique; a random high part
	// shuffles them, so that the history before the origins holds
	// versions newer than some the live part applies, and older ones.
	version int64
	// keyed puts every record of a key in one partition (the key's
	// number's parity); otherwise records alternate between partitions.
	keyed  bool
	mu     sync.Mutex
	orders []bfOrder // every order produced, with its offset
}

func newBackfillEnv(t *testing.T, _ string) *backfillEnv {
	t.Helper()
	db := testenv.Postgres(t)
	return newBackfillEnvOn(t, db, db)
}

// newBackfillEnvOn sets up the database db; the commands reach it at
// dbURL (a pooler in front of it).
func newBackfillEnvOn(t *testing.T, db, dbURL string) *backfillEnv {
	t.Helper()
	_, addr := testenv.Kafka(t, 2, bfTopic, bfTopic+".dlq")
	pool, err := pgxpool.New(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := store.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), backfillTables); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ratchet.yaml")
	if err := os.WriteFile(path, []byte(backfillYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	e := &backfillEnv{db: dbURL, addr: addr, path: path, pool: pool, rng: rand.New(rand.NewPCG(34, 2))}
	e.cfg, err = config.Load(path, e.environ())
	if err != nil {
		t.Fatal(err)
	}
	e.prod, err = kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": addr, "linger.ms": 5, "acks": "all", "log_level": 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.prod.Close)
	return e
}

func (e *backfillEnv) environ() []string {
	return []string{"RATCHET_KAFKA_BROKERS=" + e.addr, "RATCHET_POSTGRES_URL=" + e.db}
}

// produce writes n orders per partition and returns them with their
// offsets; bad says which (by index) are refused by every pipeline.
func (e *backfillEnv) produce(t *testing.T, n int, bad func(i int) bool) []bfOrder {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	deliveries := make(chan kafka.Event, 2*n)
	topic := bfTopic
	var batch []bfOrder
	for i := range 2 * n {
		o := bfOrder{ID: fmt.Sprintf("k%d", e.rng.IntN(30)), V: int64(e.rng.IntN(1<<20))<<20 + e.version, Country: []string{"fr", "de", "it"}[e.rng.IntN(3)],
			Amount: float64(e.rng.IntN(1000)), part: int32(i % 2),
			TS: time.Date(2026, 12, 1, 9, e.rng.IntN(20), e.rng.IntN(60), 0, time.UTC).Format(time.RFC3339)}
		e.version++
		if e.keyed {
			var n int32
			fmt.Sscanf(o.ID, "k%d", &n)
			o.part = n % 2
		}
		v, _ := json.Marshal(o)
		if bad != nil && bad(i) {
			o.bad = true
			v = []byte(strings.Replace(string(v), fmt.Sprintf(`"amount":%v`, o.Amount), `"amount":"oops"`, 1))
		}
		batch = append(batch, o)
		if err := e.prod.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: o.part},
			Key: []byte(o.ID), Value: v, Opaque: len(batch) - 1}, deliveries); err != nil {
			t.Fatal(err)
		}
	}
	for range batch {
		select {
		case ev := <-deliveries:
			m := ev.(*kafka.Message)
			if m.TopicPartition.Error != nil {
				t.Fatal(m.TopicPartition.Error)
			}
			batch[m.Opaque.(int)].off = int64(m.TopicPartition.Offset)
		case <-time.After(30 * time.Second):
			t.Fatal("no delivery report within 30s")
		}
	}
	e.orders = append(e.orders, batch...)
	return batch
}

// record is o as the engine hands it to the pipelines.
func (o bfOrder) record(t *testing.T) processor.Record {
	v, _ := json.Marshal(o)
	if o.bad {
		v = []byte(strings.Replace(string(v), fmt.Sprintf(`"amount":%v`, o.Amount), `"amount":"oops"`, 1))
	}
	r := processor.Record{Topic: bfTopic, Partition: o.part, Offset: o.off, Key: []byte(o.ID), Value: v}
	if err := (pipeline.JSONDecoder{}).DecodeRecord(&r); err != nil {
		t.Fatal(err)
	}
	return r
}

// live applies orders as the live engine does: every pipeline of the
// topic, a batch per partition in offset order, through the store's
// apply path. Good records only: the live engine dead-letters the others.
func (e *backfillEnv) live(t *testing.T, orders []bfOrder) {
	t.Helper()
	ctx := context.Background()
	s, err := engine.NewSampler(ctx, e.cfg, e.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	st := store.New(e.pool, s.Processor)
	for p := range int32(2) {
		var recs []processor.Record
		for _, o := range orders {
			if o.part == p && !o.bad {
				recs = append(recs, o.record(t))
			}
		}
		slices.SortFunc(recs, func(a, b processor.Record) int { return int(a.Offset - b.Offset) })
		if len(recs) == 0 {
			continue
		}
		b := processor.Batch{Topic: bfTopic, Partition: p, Start: recs[0].Offset, Next: recs[len(recs)-1].Offset + 1, Records: recs}
		if err := st.Apply(ctx, b, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// begin records the origins of every pipeline at the first offset of
// first on each partition, with the pipeline's fingerprint, as `ratchet
// run` records them with its first batch.
func (e *backfillEnv) begin(t *testing.T, first []bfOrder, adopted bool) {
	t.Helper()
	from := map[int32]int64{}
	for _, o := range first {
		if f, ok := from[o.part]; !ok || o.off < f {
			from[o.part] = o.off
		}
	}
	for _, pc := range e.cfg.Pipelines {
		fp, canon, err := pipeline.Fingerprint(pc)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.pool.Exec(context.Background(), `INSERT INTO ratchet_pipeline_definitions (consumer_group, pipeline, fingerprint, definition)
VALUES ($1, $2, $3, $4)`, e.cfg.Kafka.GroupID, pc.Name, fp, string(canon)); err != nil {
			t.Fatal(err)
		}
		for p, off := range from {
			if _, err := e.pool.Exec(context.Background(), `INSERT INTO ratchet_pipeline_origins
(consumer_group, pipeline, topic, partition, live_from, fingerprint, adopted) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
				e.cfg.Kafka.GroupID, pc.Name, bfTopic, p, off, fp, adopted); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// assertModel compares the tables with every good order applied once.
func (e *backfillEnv) assertModel(t *testing.T, withUpsert bool) {
	t.Helper()
	type agg struct {
		n             int64
		total, lo, hi float64
	}
	buckets := map[string]*agg{}
	latest := map[string]bfOrder{}
	for _, o := range e.orders {
		if o.bad {
			continue
		}
		ts, _ := time.Parse(time.RFC3339, o.TS)
		k := o.Country + " " + ts.Truncate(time.Minute).Format("15:04")
		a := buckets[k]
		if a == nil {
			a = &agg{lo: o.Amount, hi: o.Amount}
			buckets[k] = a
		}
		a.n++
		a.total += o.Amount
		a.lo, a.hi = min(a.lo, o.Amount), max(a.hi, o.Amount)
		if l, ok := latest[o.ID]; !ok || o.V > l.V {
			latest[o.ID] = o
		}
	}
	var want []string
	for k, a := range buckets {
		want = append(want, fmt.Sprintf("%s %d %v %v %v", k, a.n, a.total, a.lo, a.hi))
	}
	slices.Sort(want)
	got := e.rows(t, `SELECT country||' '||to_char(minute AT TIME ZONE 'UTC','HH24:MI')||' '||n||' '||total||' '||lo||' '||hi FROM per_minute`)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("per_minute differs from the model:\ngot\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if !withUpsert {
		return
	}
	want = want[:0]
	for id, o := range latest {
		want = append(want, fmt.Sprintf("%s %v %d", id, o.Amount, o.V))
	}
	slices.Sort(want)
	got = e.rows(t, `SELECT id||' '||amount||' '||v FROM latest`)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("latest differs from the model:\ngot\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

func (e *backfillEnv) rows(t *testing.T, q string) []string {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

func (e *backfillEnv) backfill(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return runCLI(t, e.environ(), append([]string{"pipelines", "backfill", "--config", e.path}, args...)...)
}

// The whole story in one process: history, then the pipelines go live
// while a producer keeps writing, and the backfill of the rollup and of
// the versioned upsert (versions shuffled across the origin) leaves every
// bucket and every row as if the pipelines had been there from the start.
// A dry run changes nothing; a second run finds nothing to do; records the
// pipeline refuses are dead-lettered with ratchet.backfill.
func TestBackfillFillsTheHistoryExactlyOnce(t *testing.T) {
	e := newBackfillEnv(t, "")
	e.produce(t, 150, func(i int) bool { return i == 17 || i == 200 }) // history, two bad records
	first := e.produce(t, 20, nil)
	e.live(t, first)
	e.begin(t, first, false)

	code, out, errOut := e.backfill(t, "per_minute")
	if code != ExitOK || !strings.Contains(out, "orders[0]: from 0 to 150 (exclusive), next 0, 150 offsets to apply (new)") ||
		!strings.Contains(out, "dry run") {
		t.Fatalf("dry run: exit %d\n%s\n%s", code, out, errOut)
	}
	if n := len(e.rows(t, `SELECT pipeline FROM ratchet_pipeline_backfills`)); n != 0 {
		t.Fatalf("a dry run recorded %d backfill rows", n)
	}

	// The live pipelines keep applying what is produced meanwhile.
	stopProducing := every(0, func() { e.live(t, e.produce(t, 10, nil)) })
	defer stopProducing()
	for _, name := range []string{"per_minute", "latest"} {
		code, out, errOut = e.backfill(t, name, "--execute")
		if code != ExitOK {
			stopProducing()
			t.Fatalf("backfill %s: exit %d\n%s\n%s", name, code, out, errOut)
		}
		if !strings.Contains(out, "dead-lettered orders[1]@8") || !strings.Contains(out, "dead-lettered orders[0]@100") {
			stopProducing()
			t.Fatalf("backfill %s did not dead-letter the bad records:\n%s", name, out)
		}
	}
	stopProducing()
	e.assertModel(t, true)
	var recs int64
	if err := e.pool.QueryRow(context.Background(), `SELECT sum(records) FROM ratchet_pipeline_backfills WHERE pipeline = 'per_minute'`).Scan(&recs); err != nil {
		t.Fatal(err)
	}
	if recs != 298 {
		t.Fatalf("the backfill recorded %d records applied, want 298 (300 less the 2 dead-lettered)", recs)
	}
	code, out, _ = e.backfill(t, "per_minute", "--execute")
	if code != ExitOK || !strings.Contains(out, "0 offsets to apply in all") {
		t.Fatalf("second run: exit %d\n%s", code, out)
	}
	e.assertModel(t, true)
	e.assertBackfillDeadLetters(t)
}

// assertBackfillDeadLetters reads the dead-letter topic: every dead
// letter of a backfill names its pipeline in ratchet.backfill.
func (e *backfillEnv) assertBackfillDeadLetters(t *testing.T) {
	t.Helper()
	k, err := openKafka(e.cfg, "bf-test-reader")
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	marked := map[string]int{}
	for p := range int32(2) {
		if _, err := k.readPartition(context.Background(), bfTopic+".dlq", p, 0, func(m *kafka.Message) error {
			for _, h := range m.Headers {
				if h.Key == pipeline.HeaderBackfill {
					marked[string(h.Value)]++
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if marked["per_minute"] != 2 || marked["latest"] != 2 {
		t.Fatalf("dead letters marked by pipeline: %v, want 2 of per_minute and 2 of latest", marked)
	}
}

// What a backfill refuses, each with exit code 2 or 1 and the reason: an
// upsert that deletes on tombstones, a pipeline without an origin yet, an adopted
// origin, a changed definition, and a second run while one holds the
// lease.
func TestBackfillRefusals(t *testing.T) {
	e := newBackfillEnv(t, "")
	e.produce(t, 5, nil)

	code, _, errOut := e.backfill(t, "per_minute")
	if code != ExitError || !strings.Contains(errOut, "orders[0]: pipeline per_minute has not started live there yet") {
		t.Fatalf("no origin: exit %d\n%s", code, errOut)
	}
	code, _, errOut = e.backfill(t, "nope")
	if code != ExitConfig || !strings.Contains(errOut, `no pipeline named "nope"`) {
		t.Fatalf("unknown pipeline: exit %d\n%s", code, errOut)
	}

	// An upsert that deletes on tombstones cannot be backfilled.
	deletes := strings.Replace(strings.Replace(backfillYAML, "      version_column: v\n", "      version_column: v\n      on_tombstone: delete\n", 1),
		"key: { id: value.id }", "key: { id: string(record.key) }", 1)
	path := filepath.Join(t.TempDir(), "deletes.yaml")
	if err := os.WriteFile(path, []byte(deletes), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = runCLI(t, e.environ(), "pipelines", "backfill", "latest", "--config", path)
	if code != ExitConfig || !strings.Contains(errOut, "an upsert with on_tombstone delete") {
		t.Fatalf("upsert deleting on tombstones: exit %d\n%s", code, errOut)
	}

	e.begin(t, e.produce(t, 5, nil), true)
	code, _, errOut = e.backfill(t, "per_minute")
	if code != ExitError || !strings.Contains(errOut, "was already running before its origin was recorded") {
		t.Fatalf("adopted: exit %d\n%s", code, errOut)
	}
	if _, err := e.pool.Exec(context.Background(), `UPDATE ratchet_pipeline_origins SET adopted = false, fingerprint = 'other'`); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = e.backfill(t, "per_minute")
	if code != ExitError || !strings.Contains(errOut, "began live with another definition") {
		t.Fatalf("changed definition: exit %d\n%s", code, errOut)
	}
	fp, _, _ := pipeline.Fingerprint(e.cfg.Pipelines[0])
	if _, err := e.pool.Exec(context.Background(), `UPDATE ratchet_pipeline_origins SET fingerprint = $1`, fp); err != nil {
		t.Fatal(err)
	}

	// Another run holds the lease: refused at once, nothing applied.
	lease, err := store.LockBackfill(context.Background(), e.pool, e.cfg.Kafka.GroupID, "per_minute", "other-run")
	if err != nil {
		t.Fatal(err)
	}
	code, _, errOut = e.backfill(t, "per_minute", "--execute")
	if code != ExitError || !strings.Contains(errOut, "another backfill of this pipeline is running (other-run") {
		t.Fatalf("second run: exit %d\n%s", code, errOut)
	}
	if n := len(e.rows(t, `SELECT country FROM per_minute`)); n != 0 {
		t.Fatalf("a refused run wrote %d rows", n)
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := e.backfill(t, "per_minute", "--execute")
	if code != ExitOK {
		t.Fatalf("after the release: exit %d\n%s\n%s", code, out, errOut)
	}
}

// Behind PgBouncer in transaction mode the lease, the position and the
// rows work as on a direct connection: nothing of the backfill depends on
// a server session.
func TestBackfillBehindPgBouncer(t *testing.T) {
	testenv.PgBouncerPath(t) // skips without pgbouncer (fails when CI=true)
	direct := testenv.Postgres(t)
	b := testenv.StartPgBouncer(t, direct, testenv.PgBouncerOptions{PoolSize: 2})
	e := newBackfillEnvOn(t, direct, b.URL())
	e.produce(t, 100, nil)
	first := e.produce(t, 10, nil)
	e.live(t, first)
	e.begin(t, first, false)
	for _, name := range []string{"per_minute", "latest"} {
		if code, out, errOut := e.backfill(t, name, "--execute"); code != ExitOK {
			t.Fatalf("backfill %s: exit %d\n%s\n%s", name, code, out, errOut)
		}
	}
	e.assertModel(t, true)
}

// A backfill killed with SIGKILL midway (its batches committed up to some
// point, its lease left to expire) and run again continues from the
// recorded position: every bucket equals the model, and the records the
// position counts are the history's, once each. The live pipelines keep
// applying new records meanwhile.
func TestBackfillKilledAndRerunAppliesEachRecordOnce(t *testing.T) {
	e := newBackfillEnv(t, "")
	e.produce(t, 400, nil)
	first := e.produce(t, 10, nil)
	e.live(t, first)
	e.begin(t, first, false)
	stopProducing := every(200*time.Millisecond, func() { e.live(t, e.produce(t, 5, nil)) })
	defer stopProducing()

	bin := testenv.BuildRatchet(t, "")
	p := testenv.StartProcess(t, bin, testenv.ProcessOptions{Name: "backfill",
		Args: []string{"pipelines", "backfill", "per_minute", "--execute", "--rate", "200", "--config", e.path}, Env: e.environ()})
	applied := func() int64 {
		var n int64
		if err := e.pool.QueryRow(context.Background(), `SELECT coalesce(sum(records), 0) FROM ratchet_pipeline_backfills`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	testenv.Eventually(t, 60*time.Second, func() bool { return applied() >= 200 }, "the backfill applied nothing; log:\n%s", p.Log())
	p.Kill()
	<-p.Exited()
	killedAt := applied()
	if killedAt >= 800 {
		t.Fatalf("the backfill was done (%d records) before it was killed: nothing tested", killedAt)
	}
	t.Logf("killed after %d of 800 records", killedAt)
	// The killed run's lease expires by the database's clock.
	testenv.Eventually(t, 2*store.BackfillLeaseTTL, func() bool {
		var expired bool
		err := e.pool.QueryRow(context.Background(), `SELECT coalesce(bool_and(expires_at < now()), true) FROM ratchet_pipeline_backfill_leases`).Scan(&expired)
		return err == nil && expired
	}, "the killed run's lease did not expire")
	code, out, errOut := e.backfill(t, "per_minute", "--execute")
	if code != ExitOK {
		t.Fatalf("rerun: exit %d\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "recorded, ") {
		t.Fatalf("the rerun did not continue the recorded backfill:\n%s", out)
	}
	stopProducing()
	if n := applied(); n != 800 {
		t.Fatalf("the backfill counts %d records applied, want 800", n)
	}
	e.assertModel(t, false)
}

// A rollup pipeline added to a running engine: `ratchet run` records
// where it began on each partition with its first batch there, while a
// producer keeps writing, and the backfill fills the history before it.
// After the engine caught up, every bucket equals a model of every record
// applied once from the start, and the upsert that ran throughout is
// untouched by it.
func TestBackfillAPipelineAddedToARunningEngine(t *testing.T) {
	e := newBackfillEnv(t, "")
	load := func(yaml string) config.Config { return e.load(t, yaml) }
	run := func(cfg config.Config, owner string) *testenv.Engine { return e.run(t, cfg, owner) }
	stored := func() int64 { return e.stored(t) }
	produced := e.produced
	upsertOnly := backfillUpsertOnly()
	e.produce(t, 100, nil)
	first := run(load(upsertOnly), "a")
	testenv.Eventually(t, 60*time.Second, func() bool { return stored() == 200 }, "the first engine did not apply the history")
	first.Stop(t)

	stopProducing := every(100*time.Millisecond, func() { e.produce(t, 5, nil) })
	defer stopProducing()
	second := run(load(backfillYAML), "b")
	testenv.Eventually(t, 60*time.Second, func() bool {
		var n int
		err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM ratchet_pipeline_origins WHERE pipeline = 'per_minute'`).Scan(&n)
		return err == nil && n == 2
	}, "the engine did not record where per_minute began")
	code, out, errOut := e.backfill(t, "per_minute", "--execute")
	if code != ExitOK {
		t.Fatalf("backfill: exit %d\n%s\n%s", code, out, errOut)
	}
	// The live engine's /metrics shows the backfill's committed progress.
	body := scrape(t, second.Addr(t, 10*time.Second))
	for _, want := range []string{`ratchet_pipeline_backfill_remaining_offsets{partition="0",pipeline="per_minute",topic="orders"} 0`,
		`ratchet_pipeline_backfill_running{pipeline="per_minute"} 0`} {
		if !strings.Contains(body, want) {
			t.Fatalf("the engine's /metrics lacks %s:\n%s", want, grepLines(body, "backfill"))
		}
	}
	stopProducing()
	testenv.Eventually(t, 60*time.Second, func() bool { return stored() == produced() }, "the engine did not catch up")
	second.Stop(t)
	var from, recs int64
	if err := e.pool.QueryRow(context.Background(), `SELECT sum(to_offset - from_offset), sum(records) FROM ratchet_pipeline_backfills`).Scan(&from, &recs); err != nil {
		t.Fatal(err)
	}
	if from < 200 || recs != from {
		t.Fatalf("the backfill covered %d offsets and applied %d records; want the 200 of the history at least, each once", from, recs)
	}
	e.assertModel(t, true)
}

// backfillUpsertOnly is backfillYAML without the rollup per_minute: the
// configuration before the rollup is added.
func backfillUpsertOnly() string {
	return backfillYAML[:strings.Index(backfillYAML, "  - name: per_minute")] + backfillYAML[strings.Index(backfillYAML, "  - name: latest"):]
}

// load reads yaml as ratchet run would, with the test's environment.
func (e *backfillEnv) load(t *testing.T, yaml string) config.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ratchet.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path, append(e.environ(), "RATCHET_HTTP_ADDR=127.0.0.1:0", "RATCHET_COMMIT_INTERVAL=100ms"))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// run starts a live engine as owner until it is stopped or the test ends.
func (e *backfillEnv) run(t *testing.T, cfg config.Config, owner string) *testenv.Engine {
	t.Helper()
	return testenv.StartEngine(t, testenv.EngineOptions{}, func(ctx context.Context, log *slog.Logger, onListening func(string)) error {
		return engine.Run(ctx, cfg, engine.Options{Logger: log.With("owner", owner), Owner: owner, OnListening: onListening})
	})
}

// stored is the sum of the live group's stored positions.
func (e *backfillEnv) stored(t *testing.T) int64 {
	t.Helper()
	var n int64
	if err := e.pool.QueryRow(context.Background(), `SELECT coalesce(sum(next_offset), 0) FROM ratchet_offsets WHERE consumer_group = 'bf-test'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// produced is how many records were produced.
func (e *backfillEnv) produced() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return int64(len(e.orders))
}

// backfilled is the sum of the records the backfill applied.
func (e *backfillEnv) backfilled(t *testing.T) int64 {
	t.Helper()
	var n int64
	if err := e.pool.QueryRow(context.Background(), `SELECT coalesce(sum(records), 0) FROM ratchet_pipeline_backfills`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestBackfillKilledWhileTheLiveGroupRebalances: a rollup is added to a
// running two-instance group while a producer writes 1,000 records/s; its
// backfill (the binary, a process of its own) is killed with kill -9
// midway while one live member stops and a new one joins, so that the
// partitions move under both; the rerun continues where the killed run's
// last transaction left it. Every bucket then equals a model of every
// record applied once from the start, and the upsert that ran throughout
// is untouched.
func TestBackfillKilledWhileTheLiveGroupRebalances(t *testing.T) {
	e := newBackfillEnv(t, "")
	const history = 600
	e.produce(t, history/2, nil)
	first := e.run(t, e.load(t, backfillUpsertOnly()), "a")
	testenv.Eventually(t, 60*time.Second, func() bool { return e.stored(t) == history }, "the first engine did not apply the history")
	first.Stop(t)

	stopProducing := every(100*time.Millisecond, func() { e.produce(t, 50, nil) })
	defer stopProducing()
	cfg := e.load(t, backfillYAML)
	b1, b2 := e.run(t, cfg, "b1"), e.run(t, cfg, "b2")
	testenv.Eventually(t, 60*time.Second, func() bool {
		var n int
		err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM ratchet_pipeline_origins WHERE pipeline = 'per_minute'`).Scan(&n)
		return err == nil && n == 2
	}, "the live group did not record where per_minute began")

	bin := testenv.BuildRatchet(t, "")
	p := testenv.StartProcess(t, bin, testenv.ProcessOptions{Name: "backfill",
		Args: []string{"pipelines", "backfill", "per_minute", "--execute", "--rate", "60", "--config", e.path}, Env: e.environ()})
	testenv.Eventually(t, 60*time.Second, func() bool { return e.backfilled(t) > 0 }, "the backfill applied nothing; log:\n%s", p.Log())
	// While it runs: a member leaves (its partitions move to b1), another
	// joins (they move again), then the backfill is killed.
	b2.Stop(t)
	b3 := e.run(t, cfg, "b3")
	p.Kill()
	<-p.Exited()
	killedAt := e.backfilled(t)
	if killedAt >= history {
		t.Fatalf("the backfill was done (%d records) before it was killed: nothing tested", killedAt)
	}
	t.Logf("backfill killed after %d of %d records, during the rebalance", killedAt, history)
	testenv.Eventually(t, 2*store.BackfillLeaseTTL, func() bool {
		var expired bool
		err := e.pool.QueryRow(context.Background(), `SELECT coalesce(bool_and(expires_at < now()), true) FROM ratchet_pipeline_backfill_leases`).Scan(&expired)
		return err == nil && expired
	}, "the killed run's lease did not expire")
	code, out, errOut := e.backfill(t, "per_minute", "--execute")
	if code != ExitOK {
		t.Fatalf("rerun: exit %d\n%s\n%s", code, out, errOut)
	}
	stopProducing()
	testenv.Eventually(t, 60*time.Second, func() bool { return e.stored(t) == e.produced() }, "the live group did not catch up")
	b1.Stop(t)
	b3.Stop(t)
	var span, recs int64
	if err := e.pool.QueryRow(context.Background(), `SELECT sum(to_offset - from_offset), sum(records) FROM ratchet_pipeline_backfills`).Scan(&span, &recs); err != nil {
		t.Fatal(err)
	}
	if span < history || recs != span {
		t.Fatalf("the backfill covered %d offsets and applied %d records; want the %d of the history at least, each once", span, recs, history)
	}
	e.assertModel(t, true)
}

// every runs fn every d until the returned stop is called; stop waits for
// the run in progress and may be called again.
func every(d time.Duration, fn func()) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() { // ends when stop is called
		defer close(done)
		for {
			select {
			case <-quit:
				return
			case <-time.After(d):
			}
			fn()
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(quit) })
		<-done
	}
}

// backfillPlainYAML adds to backfillYAML an upsert without a version,
// whose backfill is ordered by position: read from the newest record of
// each partition down, a backfilled record writing a row only where the
// table has none.
const backfillPlainYAML = backfillYAML + `  - name: plain
    topic: orders
    format: json
    upsert:
      table: plain
      key: { id: value.id }
      columns: { amount: double(value.amount), v: int(value.v) }
`

// An upsert without upsert.version is backfilled by position, every record
// of a key in one partition: while the live pipelines keep applying newer
// records, the backfill is killed with kill -9 midway and rerun; every
// row then holds the key's newest good record (the highest offset), as if
// the pipeline had been there from the start, every record of the range
// is applied once, and the bad records of the history are dead-lettered.
// The status shows the range applied from its end down.
func TestBackfillOrdersAnUnversionedUpsertByPosition(t *testing.T) {
	e := newBackfillEnv(t, "")
	e.keyed = true
	if _, err := e.pool.Exec(context.Background(), `CREATE TABLE plain (id text PRIMARY KEY, amount double precision, v bigint)`); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.path, []byte(backfillPlainYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	var err error
	if e.cfg, err = config.Load(e.path, e.environ()); err != nil {
		t.Fatal(err)
	}
	const history = 600
	e.produce(t, history/2, func(i int) bool { return i == 33 || i == 420 })
	first := e.produce(t, 10, nil)
	e.live(t, first)
	e.begin(t, first, false)
	stopProducing := every(100*time.Millisecond, func() { e.live(t, e.produce(t, 5, nil)) })
	defer stopProducing()

	code, out, errOut := e.backfill(t, "plain")
	if code != ExitOK || !strings.Contains(out, "read from its newest record down") {
		t.Fatalf("dry run: exit %d\n%s\n%s", code, out, errOut)
	}
	bin := testenv.BuildRatchet(t, "")
	p := testenv.StartProcess(t, bin, testenv.ProcessOptions{Name: "backfill",
		Args: []string{"pipelines", "backfill", "plain", "--execute", "--rate", "150", "--metrics-addr", "127.0.0.1:0", "--config", e.path}, Env: e.environ()})
	testenv.Eventually(t, 60*time.Second, func() bool { return e.backfilled(t) >= 150 }, "the backfill applied nothing; log:\n%s", p.Log())
	// While it runs, its own /metrics shows what it did and what remains.
	addr := regexp.MustCompile(`metrics on http://([^/]+)/metrics`).FindStringSubmatch(p.Log())
	if addr == nil {
		t.Fatalf("the backfill did not say where its metrics are:\n%s", p.Log())
	}
	body := scrape(t, addr[1])
	applied := regexp.MustCompile(`ratchet_backfill_records_total\{pipeline="plain",result="applied"\} (\d+)`).FindStringSubmatch(body)
	remaining := regexp.MustCompile(`ratchet_backfill_remaining_offsets\{pipeline="plain"\} (\d+)`).FindStringSubmatch(body)
	if applied == nil || applied[1] == "0" || remaining == nil || remaining[1] == "0" {
		t.Fatalf("the running backfill's metrics: applied %v, remaining %v\n%s", applied, remaining, grepLines(body, "ratchet_backfill"))
	}
	p.Kill()
	<-p.Exited()
	killedAt := e.backfilled(t)
	if killedAt >= history-2 {
		t.Fatalf("the backfill was done (%d records) before it was killed: nothing tested", killedAt)
	}
	t.Logf("backfill killed after %d of %d records", killedAt, history-2)
	testenv.Eventually(t, 2*store.BackfillLeaseTTL, func() bool {
		var expired bool
		err := e.pool.QueryRow(context.Background(), `SELECT coalesce(bool_and(expires_at < now()), true) FROM ratchet_pipeline_backfill_leases`).Scan(&expired)
		return err == nil && expired
	}, "the killed run's lease did not expire")
	code, out, errOut = e.backfill(t, "plain", "--execute")
	if code != ExitOK || !strings.Contains(out, "recorded, ") {
		t.Fatalf("rerun: exit %d\n%s\n%s", code, out, errOut)
	}
	stopProducing()
	if n := e.backfilled(t); n != history-2 {
		t.Fatalf("the backfill counts %d records applied, want %d (the history less the 2 dead-lettered)", n, history-2)
	}
	var from, next, to int64
	var descending bool
	if err := e.pool.QueryRow(context.Background(), `SELECT min(from_offset), min(next_offset), min(to_offset), bool_and(descending)
FROM ratchet_pipeline_backfills WHERE partition = 0`).Scan(&from, &next, &to, &descending); err != nil {
		t.Fatal(err)
	}
	if !descending || next != from || to <= from {
		t.Fatalf("partition 0's backfill: from %d to %d, position %d, descending %t; want descending, done down to its start", from, to, next, descending)
	}

	// The model: every key's newest good record, by offset (one key, one
	// partition).
	newest := map[string]bfOrder{}
	e.mu.Lock()
	for _, o := range e.orders {
		if n, ok := newest[o.ID]; !o.bad && (!ok || o.off > n.off) {
			newest[o.ID] = o
		}
	}
	e.mu.Unlock()
	var want []string
	for id, o := range newest {
		want = append(want, fmt.Sprintf("%s %v %d", id, o.Amount, o.V))
	}
	slices.Sort(want)
	got := e.rows(t, `SELECT id||' '||amount||' '||v FROM plain`)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("plain differs from the model:\ngot\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	code, out, errOut = runCLI(t, e.environ(), "pipelines", "status", "--config", e.path)
	if code != ExitOK || !strings.Contains(out, fmt.Sprintf("%d..%d down to %d", from, to, from)) {
		t.Fatalf("status: exit %d\n%s\n%s", code, out, errOut)
	}
}

// scrape returns the text of http://addr/metrics.
func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d, %v", resp.StatusCode, err)
	}
	return string(b)
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A rollup added while nothing is produced: the engine with it applies no
// batch, so no origin is written with one; the group is at rest (its
// stored positions are the partitions' ends), so the backfill takes the
// ends as where the pipeline began, records them with --execute, and
// fills every bucket from the history. A record produced afterwards is
// applied live, once.
func TestBackfillAPipelineAddedToAQuietTopic(t *testing.T) {
	e := newBackfillEnv(t, "")
	e.produce(t, 100, func(i int) bool { return i == 7 })
	first := e.run(t, e.load(t, backfillUpsertOnly()), "a")
	testenv.Eventually(t, 60*time.Second, func() bool { return e.stored(t) == 200 }, "the first engine did not apply the history")
	first.Stop(t)
	second := e.run(t, e.load(t, backfillYAML), "b")
	testenv.Eventually(t, 60*time.Second, func() bool {
		return len(e.rows(t, `SELECT pipeline FROM ratchet_pipeline_definitions WHERE pipeline = 'per_minute'`)) == 1
	}, "the engine did not record per_minute's definition")

	code, out, errOut := e.backfill(t, "per_minute")
	if code != ExitOK || !strings.Contains(out, "orders[0]: from 0 to 100 (exclusive), next 0, 100 offsets to apply (new)") ||
		!strings.Contains(out, "no record since pipeline per_minute was added") {
		t.Fatalf("dry run: exit %d\n%s\n%s", code, out, errOut)
	}
	if n := len(e.rows(t, `SELECT pipeline FROM ratchet_pipeline_origins WHERE pipeline = 'per_minute'`)); n != 0 {
		t.Fatalf("a dry run recorded %d origins", n)
	}
	code, out, errOut = e.backfill(t, "per_minute", "--execute")
	if code != ExitOK {
		t.Fatalf("backfill: exit %d\n%s\n%s", code, out, errOut)
	}
	if got := e.rows(t, `SELECT partition||' '||live_from FROM ratchet_pipeline_origins WHERE pipeline = 'per_minute'`); strings.Join(got, ",") != "0 100,1 100" {
		t.Fatalf("origins %v, want each partition's end (100)", got)
	}
	e.produce(t, 5, nil)
	testenv.Eventually(t, 60*time.Second, func() bool { return e.stored(t) == e.produced() }, "the engine did not apply the new records")
	second.Stop(t)
	if n := e.backfilled(t); n != 199 {
		t.Fatalf("the backfill applied %d records, want 199 (the history less the bad one)", n)
	}
	e.assertModel(t, true)
}
