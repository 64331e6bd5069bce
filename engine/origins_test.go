package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/cli"
	"ratchet/internal/store"
	"ratchet/internal/testenv"
	"ratchet/processor/pipeline"
)

type originRow struct {
	partition   int32
	liveFrom    int64
	fingerprint string
	adopted     bool
	liveSince   time.Time
}

func readOrigins(tb testing.TB, pool *pgxpool.Pool, name string) map[int32]originRow {
	tb.Helper()
	rows, err := pool.Query(context.Background(), `SELECT partition, live_from, fingerprint, adopted, live_since
FROM ratchet_pipeline_origins WHERE pipeline = $1`, name)
	if err != nil {
		tb.Fatalf("read origins: %v", err)
	}
	defer rows.Close()
	out := map[int32]originRow{}
	for rows.Next() {
		var o originRow
		if err := rows.Scan(&o.partition, &o.liveFrom, &o.fingerprint, &o.adopted, &o.liveSince); err != nil {
			tb.Fatal(err)
		}
		out[o.partition] = o
	}
	if rows.Err() != nil {
		tb.Fatal(rows.Err())
	}
	return out
}

func fingerprintOf(tb testing.TB, p config.Pipeline) string {
	tb.Helper()
	fp, _, err := pipeline.Fingerprint(p)
	if err != nil {
		tb.Fatal(err)
	}
	return fp
}

// TestOriginCommittedWithItsBatch: a pipeline's origin on a partition is
// written in the transaction of the first batch it applies there: while
// every batch fails (the table lacks a column) there is no origin, though
// the definition is recorded at start; once the table is fixed, each
// partition's origin is its first offset, with the pipeline's
// fingerprint. A restart with more records keeps the origins as they were.
func TestOriginCommittedWithItsBatch(t *testing.T) {
	const partitions = 2
	cluster, addr := testenv.Kafka(t, partitions, topic, topic+".dlq")
	db := testenv.Postgres(t)
	pool := openPool(t, db)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE items (id text PRIMARY KEY, amount double precision)`); err != nil {
		t.Fatal(err)
	}
	p := itemPipeline("double(value.amount)")
	cfg := guardConfig(t, addr, db, p)
	reg := prometheus.NewRegistry()
	eng := startWith(t, cfg, engine.Options{Registry: reg}, testenv.Log{})
	base := "http://" + eng.Addr(t, 60*time.Second)
	testenv.Eventually(t, 60*time.Second, func() bool {
		code, _ := readyz(t, base)
		return code == http.StatusOK
	}, "/readyz 200 once started")
	// The table breaks after the start's check: every batch fails.
	if _, err := pool.Exec(ctx, `ALTER TABLE items DROP COLUMN amount`); err != nil {
		t.Fatal(err)
	}
	produceItems(t, addr, 0, 100, partitions, nil)
	testenv.Eventually(t, 60*time.Second, func() bool {
		code, why := readyz(t, base)
		return code == http.StatusServiceUnavailable && strings.Contains(why, "table items")
	}, "/readyz 503: every batch of the pipeline fails")
	// Batches were tried and rolled back: no origin without its rows.
	if got := count(t, pool, `SELECT count(*) FROM ratchet_pipeline_origins`); got != 0 {
		t.Fatalf("%d origins recorded while no batch committed, want 0", got)
	}
	if got := count(t, pool, `SELECT count(*) FROM ratchet_pipeline_definitions WHERE pipeline = 'items' AND fingerprint = '`+fingerprintOf(t, p)+`'`); got != 1 {
		t.Fatalf("%d definitions of items recorded at start, want 1", got)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE items ADD COLUMN amount double precision`); err != nil {
		t.Fatal(err)
	}
	waitAppliedToEnd(t, cluster, pool, cfg.Kafka.GroupID)
	origins := readOrigins(t, pool, "items")
	if len(origins) != partitions {
		t.Fatalf("origins %v, want one per partition", origins)
	}
	for part, o := range origins {
		if o.liveFrom != 0 || o.adopted || o.fingerprint != fingerprintOf(t, p) {
			t.Errorf("partition %d: origin %+v, want live from 0, not adopted, the pipeline's fingerprint", part, o)
		}
	}
	eng.Stop(t)

	produceItems(t, addr, 100, 50, partitions, nil)
	eng = startWith(t, cfg, engine.Options{}, testenv.Log{})
	waitAppliedToEnd(t, cluster, pool, cfg.Kafka.GroupID)
	eng.Stop(t)
	again := readOrigins(t, pool, "items")
	for part, o := range origins {
		if a := again[part]; a.liveFrom != o.liveFrom || !a.liveSince.Equal(o.liveSince) {
			t.Errorf("partition %d: origin %+v after the restart, want %+v kept", part, a, o)
		}
	}
	if got := count(t, pool, `SELECT count(*) FROM items`); got != 150 {
		t.Errorf("%d rows, want 150", got)
	}
}

// pipelineEnv is the environment of a ratchet command against the test
// broker and database; the configuration file written for it holds the
// pipelines given, as YAML.
func pipelineEnv(t *testing.T, addr, db string, cfg config.Config, pipelinesYAML string) (env []string, path string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "ratchet.yaml")
	yaml := "kafka:\n  topics: [" + topic + "]\npipelines:\n" + pipelinesYAML
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{"RATCHET_KAFKA_BROKERS=" + addr, "RATCHET_POSTGRES_URL=" + db, "RATCHET_KAFKA_GROUP_ID=" + cfg.Kafka.GroupID}, path
}

func ratchetCmd(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	code := cli.Run(ctx, args, env, &out, &errOut)
	return code, out.String(), errOut.String()
}

const itemsYAML = "  - name: items\n    topic: " + topic + "\n    format: json\n" +
	"    upsert: {table: items, key: {id: string(record.key)}, columns: {amount: %s}}\n"

func itemsPipelineYAML(amount string) string { return strings.Replace(itemsYAML, "%s", amount, 1) }

// TestDefinitionChangeRefused: a pipeline restarted with another
// definition under its name is refused by ratchet run and by ratchet
// pipelines check (exit code 2), naming the pipeline, what changed and
// both remedies, and nothing of it is applied; the same definition
// written otherwise starts. After `pipelines reset items --execute` the
// changed definition starts and records its origins afresh.
func TestDefinitionChangeRefused(t *testing.T) {
	const partitions = 2
	cluster, addr := testenv.Kafka(t, partitions, topic, topic+".dlq")
	db := testenv.Postgres(t)
	pool := openPool(t, db)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE items (id text PRIMARY KEY, amount double precision)`); err != nil {
		t.Fatal(err)
	}
	cfg := guardConfig(t, addr, db, itemPipeline("double(value.amount)"))
	produceItems(t, addr, 0, 40, partitions, nil)
	eng := startWith(t, cfg, engine.Options{}, testenv.Log{})
	waitAppliedToEnd(t, cluster, pool, cfg.Kafka.GroupID)
	eng.Stop(t)

	changed := guardConfig(t, addr, db, itemPipeline("double(value.amount) * 2.0"))
	produceItems(t, addr, 40, 40, partitions, nil)
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := engine.Run(rctx, changed, engine.Options{})
	if !config.IsConfigError(err) {
		t.Fatalf("run with a changed definition: %v, want a configuration error (exit code 2)", err)
	}
	for _, want := range []string{"pipelines[0]: pipeline items: its definition differs", `upsert.columns.amount: "double(value.amount)" → "double(value.amount) * 2.0"`,
		"new name", "ratchet pipelines backfill", "ratchet pipelines reset items --execute"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal lacks %q:\n%v", want, err)
		}
	}
	if got := count(t, pool, `SELECT count(*) FROM items`); got != 40 {
		t.Fatalf("%d rows after the refused start, want 40", got)
	}

	env, path := pipelineEnv(t, addr, db, cfg, itemsPipelineYAML("double(value.amount) * 2.0"))
	code, out, errOut := ratchetCmd(t, env, "pipelines", "check", "--config", path)
	if code != cli.ExitConfig || !strings.Contains(errOut, "ratchet pipelines reset items --execute") {
		t.Fatalf("pipelines check of the changed definition: exit %d, want 2 naming the remedy\n%s%s", code, out, errOut)
	}
	// The same definition, written otherwise, is no change.
	env, same := pipelineEnv(t, addr, db, cfg, "  - name: items\n    format: json\n    topic: "+topic+"\n    upsert:\n      columns: {amount: 'double( value.amount )'}\n      key: {id: string(record.key)}\n      table: public.items\n")
	if code, out, errOut := ratchetCmd(t, env, "pipelines", "check", "--config", same); code != cli.ExitOK {
		t.Fatalf("pipelines check of a reformatted definition: exit %d\n%s%s", code, out, errOut)
	}
	reformatted := guardConfig(t, addr, db, itemPipeline("double( value.amount )"))
	eng = startWith(t, reformatted, engine.Options{}, testenv.Log{})
	waitAppliedToEnd(t, cluster, pool, cfg.Kafka.GroupID)
	eng.Stop(t)
	if got := count(t, pool, `SELECT count(*) FROM items WHERE amount = substr(id, 2)::int`); got != 80 {
		t.Fatalf("%d rows exact after the reformatted start, want 80", got)
	}

	// Reset on purpose: the changed definition is accepted, its origins
	// recorded again from where it goes on.
	code, out, errOut = ratchetCmd(t, env[:len(env):len(env)], "pipelines", "reset", "items", "--config", path)
	if code != cli.ExitOK || !strings.Contains(out, "dry run") || !strings.Contains(out, "upsert.columns.amount") {
		t.Fatalf("reset dry run: exit %d\n%s%s", code, out, errOut)
	}
	if got := count(t, pool, `SELECT count(*) FROM ratchet_pipeline_origins`); got != partitions {
		t.Fatalf("the dry run changed the origins: %d, want %d", got, partitions)
	}
	code, out, errOut = ratchetCmd(t, env, "pipelines", "reset", "items", "--execute", "--config", path)
	if code != cli.ExitOK || !strings.Contains(out, "forgot 1 definition, 2 origins") {
		t.Fatalf("reset --execute: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := ratchetCmd(t, env, "pipelines", "check", "--config", path); code != cli.ExitOK {
		t.Fatalf("pipelines check after the reset: exit %d\n%s%s", code, out, errOut)
	}
	produceItems(t, addr, 80, 20, partitions, nil)
	eng = startWith(t, changed, engine.Options{}, testenv.Log{})
	waitAppliedToEnd(t, cluster, pool, cfg.Kafka.GroupID)
	eng.Stop(t)
	next := storedNext(t, pool, cfg.Kafka.GroupID)
	origins := readOrigins(t, pool, "items")
	for part, o := range origins {
		if o.fingerprint != fingerprintOf(t, changed.Pipelines[0]) || o.liveFrom <= 0 || o.liveFrom >= next[part] || o.adopted {
			t.Errorf("partition %d: origin %+v after the reset, want the new fingerprint, live from the first new batch", part, o)
		}
	}
	if len(origins) != partitions {
		t.Errorf("%d origins after the reset, want %d", len(origins), partitions)
	}
}

// TestPipelinesStatusAndForget: status shows each pipeline's origin per
// partition and the recorded pipelines no longer configured; forget
// refuses a configured pipeline, prints what it would do without
// --execute, and removes the record with it.
func TestPipelinesStatusAndForget(t *testing.T) {
	const partitions = 2
	cluster, addr := testenv.Kafka(t, partitions, topic, topic+".dlq")
	db := testenv.Postgres(t)
	pool := openPool(t, db)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE items (id text PRIMARY KEY, amount double precision)`); err != nil {
		t.Fatal(err)
	}
	cfg := guardConfig(t, addr, db, itemPipeline("double(value.amount)"))
	produceItems(t, addr, 0, 40, partitions, nil)
	eng := startWith(t, cfg, engine.Options{}, testenv.Log{})
	waitAppliedToEnd(t, cluster, pool, cfg.Kafka.GroupID)
	eng.Stop(t)
	if _, err := pool.Exec(ctx, `INSERT INTO ratchet_pipeline_backfills (consumer_group, pipeline, topic, partition, from_offset, to_offset, next_offset, records)
VALUES ($1, 'items', $2, 1, 0, 0, 0, 0)`, cfg.Kafka.GroupID, topic); err != nil {
		t.Fatal(err)
	}

	env, path := pipelineEnv(t, addr, db, cfg, itemsPipelineYAML("double(value.amount)"))
	code, out, errOut := ratchetCmd(t, env, "pipelines", "status", "--config", path)
	if code != cli.ExitOK {
		t.Fatalf("status: exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"PIPELINE", "items", "configured", topic, "before 0"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	code, out, errOut = ratchetCmd(t, env, "pipelines", "status", "--json", "--config", path)
	var st struct {
		Group     string `json:"group"`
		Pipelines []struct {
			Pipeline, State string
			Partitions      []struct {
				Partition    int32  `json:"partition"`
				LiveFrom     int64  `json:"live_from"`
				BackfillNext *int64 `json:"backfill_next"`
				Remains      string `json:"remains"`
			} `json:"partitions"`
		} `json:"pipelines"`
	}
	if code != cli.ExitOK || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("status --json: exit %d\n%s%s", code, out, errOut)
	}
	if len(st.Pipelines) != 1 || st.Pipelines[0].State != "configured" || len(st.Pipelines[0].Partitions) != partitions {
		t.Fatalf("status --json: %+v", st)
	}
	for _, p := range st.Pipelines[0].Partitions {
		if p.Partition == 1 && (p.BackfillNext == nil || p.Remains != "none") {
			t.Errorf("partition 1: %+v, want the backfill row (finished)", p)
		}
		if p.Partition == 0 && (p.BackfillNext != nil || p.Remains != "before 0") {
			t.Errorf("partition 0: %+v, want no backfill", p)
		}
	}

	// items is configured: forget refuses it.
	if code, out, errOut := ratchetCmd(t, env, "pipelines", "forget", "items", "--execute", "--config", path); code != cli.ExitConfig ||
		!strings.Contains(errOut, "remove it from pipelines first") {
		t.Fatalf("forget of a configured pipeline: exit %d, want 2\n%s%s", code, out, errOut)
	}
	// Renamed in the configuration: items is removed, its record kept.
	env, renamed := pipelineEnv(t, addr, db, cfg, strings.Replace(itemsPipelineYAML("double(value.amount)"), "name: items", "name: items_v2", 1))
	code, out, errOut = ratchetCmd(t, env, "pipelines", "status", "--config", renamed)
	if code != cli.ExitOK || !strings.Contains(out, "removed") || !strings.Contains(out, "ratchet pipelines forget items --execute") ||
		!strings.Contains(out, "not recorded") {
		t.Fatalf("status after the rename: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = ratchetCmd(t, env, "pipelines", "forget", "items", "--config", renamed)
	if code != cli.ExitOK || !strings.Contains(out, "would forget") || !strings.Contains(out, "2 origins and 1 backfill position") {
		t.Fatalf("forget dry run: exit %d\n%s%s", code, out, errOut)
	}
	if got := count(t, pool, `SELECT count(*) FROM ratchet_pipeline_origins`); got != partitions {
		t.Fatalf("the dry run removed origins: %d left", got)
	}
	code, out, errOut = ratchetCmd(t, env, "pipelines", "forget", "items", "--execute", "--config", renamed)
	if code != cli.ExitOK || !strings.Contains(out, "forgot 1 definition, 2 origins and 1 backfill position") {
		t.Fatalf("forget --execute: exit %d\n%s%s", code, out, errOut)
	}
	for _, table := range []string{"ratchet_pipeline_definitions", "ratchet_pipeline_origins", "ratchet_pipeline_backfills"} {
		if got := count(t, pool, `SELECT count(*) FROM `+table); got != 0 {
			t.Errorf("%s: %d rows after forget, want 0", table, got)
		}
	}
	if code, out, errOut := ratchetCmd(t, env, "pipelines", "forget", "items", "--execute", "--config", renamed); code != cli.ExitConfig ||
		!strings.Contains(errOut, "nothing is recorded") {
		t.Fatalf("forget of nothing: exit %d, want 2\n%s%s", code, out, errOut)
	}
}

// TestPipelineAdoption: a group that ran before origins were recorded
// (positions in ratchet_offsets, no pipeline recorded) has its pipelines
// adopted at start: each origin is the stored position, marked adopted.
func TestPipelineAdoption(t *testing.T) {
	const partitions = 2
	cluster, addr := testenv.Kafka(t, partitions, topic, topic+".dlq")
	db := testenv.Postgres(t)
	pool := openPool(t, db)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE items (id text PRIMARY KEY, amount double precision)`); err != nil {
		t.Fatal(err)
	}
	cfg := guardConfig(t, addr, db, itemPipeline("double(value.amount)"))
	produceItems(t, addr, 0, 40, partitions, nil)
	// What an older ratchet left: its positions (with migration 007
	// applied by this start, as an upgrade does).
	if err := migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO ratchet_offsets (consumer_group, topic, partition, next_offset, epoch, owner)
VALUES ($1, $2, 0, 5, 1, 'old'), ($1, $2, 1, 7, 1, 'old')`, cfg.Kafka.GroupID, topic); err != nil {
		t.Fatal(err)
	}
	eng := startWith(t, cfg, engine.Options{}, testenv.Log{})
	waitAppliedToEnd(t, cluster, pool, cfg.Kafka.GroupID)
	eng.Stop(t)
	origins := readOrigins(t, pool, "items")
	want := map[int32]int64{0: 5, 1: 7}
	for part, from := range want {
		if o := origins[part]; o.liveFrom != from || !o.adopted {
			t.Errorf("partition %d: origin %+v, want adopted from %d", part, o, from)
		}
	}
	if got := count(t, pool, `SELECT count(*) FROM items`); got != 40-5-7 {
		t.Errorf("%d rows, want %d", got, 40-5-7)
	}
}

// TestDefinitionsWaitForPostgres: PostgreSQL unreachable at start holds the
// definition check (nothing recorded, nothing consumed) until it is back;
// then the start goes on and records the definition and origins. A
// failing read of the definitions ends the start instead of taking the
// group for one with nothing recorded.
func TestDefinitionsWaitForPostgres(t *testing.T) {
	const partitions = 2
	cluster, addr := testenv.Kafka(t, partitions, topic, topic+".dlq")
	direct := testenv.Postgres(t)
	pool := openPool(t, direct)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE items (id text PRIMARY KEY, amount double precision)`); err != nil {
		t.Fatal(err)
	}
	proxy, dbURL := behindProxy(t, direct)
	proxy.Cut()
	cfg := guardConfig(t, addr, dbURL, itemPipeline("double(value.amount)"))
	cfg.Startup.Timeout = 2 * time.Minute
	produceItems(t, addr, 0, 40, partitions, nil)
	var logs testenv.Buffer
	eng := startWith(t, cfg, engine.Options{}, testenv.Log{To: &logs, JSON: true})
	testenv.Eventually(t, 30*time.Second, func() bool {
		return len(logs.Lines(`"dependency":"PostgreSQL"`)) >= 2
	}, "two attempts at PostgreSQL:\n%s", logs.String())
	if got := count(t, pool, `SELECT count(*) FROM ratchet_pipeline_definitions`); got > 0 {
		t.Fatalf("%d definitions recorded while PostgreSQL was unreachable", got)
	}
	proxy.Restore()
	waitAppliedToEnd(t, cluster, pool, cfg.Kafka.GroupID)
	eng.Stop(t)
	if got := count(t, pool, `SELECT count(*) FROM ratchet_pipeline_definitions`); got != 1 {
		t.Fatalf("%d definitions, want 1", got)
	}
	if got := len(readOrigins(t, pool, "items")); got != partitions {
		t.Fatalf("%d origins, want %d", got, partitions)
	}

	// The definitions cannot be read: the start fails, nothing applied.
	if _, err := pool.Exec(ctx, `ALTER TABLE ratchet_pipeline_definitions RENAME TO ratchet_pipeline_definitions_away`); err != nil {
		t.Fatal(err)
	}
	produceItems(t, addr, 40, 20, partitions, nil)
	before := count(t, pool, `SELECT count(*) FROM items`)
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cfg.Startup.Timeout = 5 * time.Second
	err := engine.Run(rctx, cfg, engine.Options{})
	if err == nil || config.IsConfigError(err) || !strings.Contains(err.Error(), "pipeline definitions") {
		t.Fatalf("start with the definitions unreadable: %v, want the database's error", err)
	}
	if got := count(t, pool, `SELECT count(*) FROM items`); got != before {
		t.Fatalf("%d rows after the failed start, want %d", got, before)
	}
}

// migrate applies ratchet's migrations to the database at url.
func migrate(ctx context.Context, url string) error {
	p, err := store.Open(ctx, url, 2)
	if err != nil {
		return err
	}
	defer p.Close()
	return store.Migrate(ctx, p)
}
