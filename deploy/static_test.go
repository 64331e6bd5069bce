package deploy

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"ratchet/internal/produce"
	"ratchet/internal/testenv"
)

// The static-binary run: a backlog of events on a 4-partition topic,
// consumed by the static binary in exactly-once mode.
const (
	staticEvents     = 3000
	staticPartitions = 4
	staticTopic      = "events"
	staticGroup      = "ratchet-static"
	staticInstance   = "ratchet-0"
)

// TestStaticBinaryConsumesIntoPostgres builds the binary the container image
// runs, with `make image-binary`, proves it is statically linked, and runs it
// as `ratchet run` against kfake and a fresh PostgreSQL database: it must
// apply every good event, serve its probes, and stop with exit code 0 on
// SIGTERM.
func TestStaticBinaryConsumesIntoPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the static binary; not in -short")
	}
	if _, err := exec.LookPath("musl-gcc"); err != nil {
		if os.Getenv("CI") != "true" {
			t.Skip("musl-gcc not found: the static build is not tested (install it with: sudo apt-get install -y musl-tools)")
		}
		// With CI=true, make installs musl-tools as root or fails.
	}
	dbURL := testenv.Postgres(t)
	bin := buildStatic(t)
	assertStatic(t, bin)

	_, broker := testenv.Kafka(t, staticPartitions, staticTopic, staticTopic+".dlq")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := produce.Run(ctx, produce.Options{
		Brokers: []string{broker}, Topic: staticTopic, Count: staticEvents, PoisonFraction: 0.01, Seed: 7,
		Properties: map[string]string{"linger.ms": "1"},
	}, quiet())
	if err != nil {
		t.Fatalf("produce: %v", err)
	}
	good := st.Produced - st.Poison
	if st.Produced != staticEvents || st.Poison == 0 || good == 0 {
		t.Fatalf("produced %+v: want %d records with some poison", st, staticEvents)
	}

	logs := &syncBuffer{}
	cmd := exec.Command(bin, "run")
	cmd.Env = []string{
		"RATCHET_KAFKA_BROKERS=" + broker,
		"RATCHET_KAFKA_TOPICS=" + staticTopic,
		"RATCHET_KAFKA_GROUP_ID=" + staticGroup,
		"RATCHET_KAFKA_INSTANCE_ID=" + staticInstance,
		"RATCHET_POSTGRES_URL=" + dbURL,
		"RATCHET_HTTP_ADDR=127.0.0.1:0",
		"RATCHET_COMMIT_MODE=exactly-once",
		"RATCHET_SHUTDOWN_TIMEOUT=15s",
		"RATCHET_LOG_FORMAT=json",
	}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	// waitErr is written once, before done is closed.
	var waitErr error
	done := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(done) }() // ends when the process exits; killed in the cleanup at the latest
	exited := func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
	t.Cleanup(func() {
		if !exited() {
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("ratchet output:\n%s", logs.tail(60))
		}
	})

	var addr string
	testenv.Eventually(t, 30*time.Second, func() bool {
		addr = logs.field("http listening", "addr")
		return addr != "" || exited()
	}, "ratchet logs the HTTP address")
	if addr == "" {
		t.Fatalf("ratchet exited before listening: %v", waitErr)
	}
	for _, path := range []string{"/healthz", "/metrics"} {
		if code := httpGet(t, "http://"+addr+path); code != http.StatusOK {
			t.Errorf("GET %s: %d, want 200", path, code)
		}
	}

	// The page listens first (a start waits for PostgreSQL and Kafka);
	// the schema exists once the instance is ready.
	testenv.Eventually(t, 45*time.Second, func() bool {
		return exited() || httpGet(t, "http://"+addr+"/readyz") == http.StatusOK
	}, "ratchet is ready")
	conn, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	applied := func() int64 {
		var n int64
		if err := conn.QueryRow(context.Background(), `SELECT coalesce(sum(count), 0) FROM dashboard_rollups`).Scan(&n); err != nil {
			t.Fatalf("count rollups: %v", err)
		}
		return n
	}
	testenv.Eventually(t, 45*time.Second, func() bool { return applied() >= good || exited() },
		"dashboard_rollups counts %d good events", good)
	if got := applied(); got != good {
		t.Fatalf("dashboard_rollups count %d, want %d good events (exited: %v)", got, good, exited())
	}
	if code := httpGet(t, "http://"+addr+"/readyz"); code != http.StatusOK {
		t.Errorf("GET /readyz: %d, want 200 while consuming", code)
	}
	// Every record, poison included, moved the stored offsets; the owner is
	// the instance id.
	var next, owned int64
	if err := conn.QueryRow(context.Background(),
		`SELECT coalesce(sum(next_offset), 0), count(*) FILTER (WHERE owner = $2) FROM ratchet_offsets WHERE consumer_group = $1`,
		staticGroup, staticInstance).Scan(&next, &owned); err != nil {
		t.Fatalf("read ratchet_offsets: %v", err)
	}
	if next != st.Produced || owned != staticPartitions {
		t.Errorf("ratchet_offsets: next offsets sum to %d (want %d), %d of %d partitions owned by %s",
			next, st.Produced, owned, staticPartitions, staticInstance)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-done:
		if waitErr != nil {
			t.Fatalf("ratchet exited with %v after SIGTERM, want exit code 0", waitErr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("ratchet did not exit within 30s of SIGTERM")
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit code %d, want 0", code)
	}
	if logs.field("engine stopped", "msg") == "" {
		t.Error("ratchet did not log \"engine stopped\"")
	}
}

// buildStatic runs `make image-binary` into a temporary directory and
// returns the binary's path.
func buildStatic(tb testing.TB) string {
	tb.Helper()
	bin := filepath.Join(tb.TempDir(), "ratchet-static")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "-C", root(tb), "-f", imageMakefile, "image-binary", "STATIC_BIN="+bin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		tb.Fatalf("make image-binary: %v\n%s", err, out)
	}
	return bin
}

// assertStatic fails unless the ELF file at path needs no dynamic loader
// and no shared library.
func assertStatic(tb testing.TB, path string) {
	tb.Helper()
	f, err := elf.Open(path)
	if err != nil {
		tb.Fatalf("open %s: %v", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			tb.Errorf("%s has a %s program header: it is dynamically linked", path, p.Type)
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		tb.Fatalf("read DT_NEEDED of %s: %v", path, err)
	}
	if len(libs) > 0 {
		tb.Errorf("%s needs shared libraries %v", path, libs)
	}
}

func httpGet(tb testing.TB, url string) int {
	tb.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		tb.Errorf("GET %s: %v", url, err)
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// quiet discards the producer's log lines.
func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// syncBuffer collects a subprocess's output; safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// field returns key of the first JSON log line whose msg is msg.
func (s *syncBuffer) field(msg, key string) string {
	sc := bufio.NewScanner(strings.NewReader(s.String()))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) != nil || line["msg"] != msg {
			continue
		}
		if v, ok := line[key].(string); ok {
			return v
		}
	}
	return ""
}

// tail returns the last n lines.
func (s *syncBuffer) tail(n int) string {
	lines := strings.Split(strings.TrimRight(s.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
