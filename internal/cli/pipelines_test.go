package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"ratchet/internal/testenv"
)

const checkYAML = `
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
  - name: revenue_per_minute
    topic: orders
    format: json
    rollup:
      table: revenue_per_minute
      time: value.ts
      bucket: 1m
      bucket_column: minute
      group_by: { country: string(value.customer.country) }
      aggregates: { orders: count, revenue: sum(double(value.amount)) }
`

func writeConfig(tb testing.TB, yaml string) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "ratchet.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

func runCLI(tb testing.TB, env []string, args ...string) (code int, stdout, stderr string) {
	tb.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code = Run(ctx, args, env, &out, &errOut)
	return code, out.String(), errOut.String()
}

// A pipeline whose CEL does not compile stops `ratchet run` with exit code
// 2 naming the key, before anything connects.
func TestRunRefusesABadPipelineBeforeConnecting(t *testing.T) {
	path := writeConfig(t, strings.Replace(checkYAML, "amount: double(value.amount),", "amount: double(value.amount +),", 1))
	env := []string{"RATCHET_KAFKA_BROKERS=127.0.0.1:1", "RATCHET_POSTGRES_URL=postgres://127.0.0.1:1/x", "RATCHET_HTTP_ADDR="}
	code, _, stderr := runCLI(t, env, "run", "--config", path)
	if code != ExitConfig {
		t.Fatalf("exit code %d, want %d; stderr: %s", code, ExitConfig, stderr)
	}
	if !strings.Contains(stderr, "ratchet: config: pipelines[0].upsert.columns.amount: CEL does not compile") {
		t.Fatalf("stderr does not name the key: %s", stderr)
	}
}

// `ratchet pipelines check` names each problem with its pipeline and key,
// exits 2, and prints CREATE TABLE statements for missing tables that,
// once run, satisfy the check.
func TestPipelinesCheck(t *testing.T) {
	db := testenv.Postgres(t)
	env := []string{"RATCHET_POSTGRES_URL=" + db}
	path := writeConfig(t, checkYAML)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// orders exists without a unique key on order_id and without amount;
	// revenue_per_minute does not exist.
	if _, err := conn.Exec(ctx, `CREATE TABLE orders (order_id text, customer text, updated_at timestamptz)`); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCLI(t, env, "pipelines", "check", "--config", path)
	if code != ExitConfig {
		t.Fatalf("exit code %d, want %d; stderr: %s", code, ExitConfig, stderr)
	}
	for _, want := range []string{
		"ratchet: config: pipelines[0].upsert.columns.amount: pipeline orders: table orders has no column amount",
		"ratchet: config: pipelines[0].upsert.key: pipeline orders: no unique constraint or primary key of orders covers exactly the upsert key (order_id)",
		"ratchet: config: pipelines[1].rollup.table: pipeline revenue_per_minute: table revenue_per_minute does not exist",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	create, ok := strings.CutPrefix(stdout, "-- tables that would satisfy the pipelines:\n")
	if !ok || !strings.Contains(create, "CREATE TABLE revenue_per_minute (") {
		t.Fatalf("stdout has no CREATE TABLE: %s", stdout)
	}
	if _, err := conn.Exec(ctx, create); err != nil {
		t.Fatalf("the printed CREATE TABLE fails: %v\n%s", err, create)
	}
	if _, err := conn.Exec(ctx, `ALTER TABLE orders ADD COLUMN amount numeric, ADD PRIMARY KEY (order_id)`); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = runCLI(t, env, "pipelines", "check", "--config", path)
	if code != ExitOK {
		t.Fatalf("exit code %d after the fix; stderr: %s", code, stderr)
	}
	if !strings.Contains(stdout, "pipeline orders: ok") || !strings.Contains(stdout, "pipeline revenue_per_minute: ok") {
		t.Fatalf("stdout: %s", stdout)
	}
}

// `ratchet run` checks the tables at start: a missing one stops it with
// exit code 2 naming the pipeline, before anything is consumed.
func TestRunChecksThePipelineTablesAtStart(t *testing.T) {
	db := testenv.Postgres(t)
	path := writeConfig(t, checkYAML)
	env := []string{"RATCHET_POSTGRES_URL=" + db, "RATCHET_KAFKA_BROKERS=127.0.0.1:1", "RATCHET_HTTP_ADDR="}
	code, _, stderr := runCLI(t, env, "run", "--config", path)
	if code != ExitConfig {
		t.Fatalf("exit code %d, want %d; stderr: %s", code, ExitConfig, stderr)
	}
	if !strings.Contains(stderr, "ratchet: config: pipelines[0].upsert.table: pipeline orders: table orders does not exist") {
		t.Fatalf("stderr: %s", stderr)
	}
}

// `ratchet dev --config examples/pipelines/dashboard.yaml` runs the
// dashboard as a pipeline: the page charts its rollups and its pipelines
// panel counts the records it wrote.
func TestDevRunsTheDashboardPipelineExample(t *testing.T) {
	dbURL := testenv.Postgres(t)
	var out, errOut testenv.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"dev", "--config", "../../examples/pipelines/dashboard.yaml", "-rate", "300", "-partitions", "3"}, []string{
			"RATCHET_POSTGRES_URL=" + dbURL, "RATCHET_HTTP_ADDR=127.0.0.1:0", "RATCHET_COMMIT_INTERVAL=200ms",
		}, &out, &errOut)
	}()
	defer func() {
		cancel()
		select {
		case code := <-done:
			if code != ExitOK {
				t.Errorf("dev exited %d; stderr tail: %s", code, tail(errOut.String()))
			}
		case <-time.After(60 * time.Second):
			t.Error("dev did not stop within 60s")
		}
	}()
	re := regexp.MustCompile(`open (http://127\.0\.0\.1:\d+/)`)
	var url string
	testenv.Eventually(t, 60*time.Second, func() bool {
		m := re.FindStringSubmatch(out.String())
		if m != nil {
			url = m[1]
		}
		return m != nil
	}, "dev prints the page URL; stderr: %s", tail(errOut.String()))
	type state struct {
		Rollups []struct {
			Count int64 `json:"count"`
		} `json:"rollups"`
		Pipelines []struct {
			Name    string `json:"name"`
			Written int64  `json:"written"`
			Merged  int64  `json:"merged"`
		} `json:"pipelines"`
	}
	var last string
	ok := func() bool {
		resp, err := http.Get(url + "api/state")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		last = string(body)
		var s state
		if json.Unmarshal(body, &s) != nil {
			return false
		}
		var rolled int64
		for _, r := range s.Rollups {
			rolled += r.Count
		}
		return rolled > 0 && len(s.Pipelines) == 1 && s.Pipelines[0].Name == "dashboard" &&
			s.Pipelines[0].Written > 0 && s.Pipelines[0].Merged > 0
	}
	for deadline := time.Now().Add(60 * time.Second); !ok(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the page does not show the dashboard pipeline's rollups and counts within 60s; /api/state tail: %s", last[max(0, len(last)-600):])
		}
	}
}
