package engine_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/testenv"
	ratchetv1 "ratchet/messages/ratchet/v1"
)

// behindProxy returns dbURL pointed at a fault proxy in front of
// PostgreSQL, with a password (trust auth ignores it) that must never be
// printed.
func behindProxy(t *testing.T, dbURL string) (*testenv.Proxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("parse %s: %v", dbURL, err)
	}
	p := testenv.NewProxy(t, u.Host)
	u.Host = p.Addr()
	u.User = url.UserPassword(u.User.Username(), "s3cret-start")
	return p, u.String()
}

// closedPort returns a loopback address nothing listens on (until the test
// starts something there).
func closedPort(t *testing.T) (string, int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr, ln.Addr().(*net.TCPAddr).Port
}

// probe returns the status code and body of GET url.
func probe(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(body)
}

// TestStartWaitsForPostgres: PostgreSQL refuses connections when the
// engine starts. The engine does not exit: it serves /healthz 200 and
// /readyz 503 naming PostgreSQL, logs one WARN per attempt (password
// redacted), and once PostgreSQL is reachable it starts and applies.
func TestStartWaitsForPostgres(t *testing.T) {
	_, addr := testenv.Kafka(t, 3, topic)
	direct := testenv.Postgres(t)
	proxy, dbURL := behindProxy(t, direct)
	proxy.Cut()
	cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
	cfg.HTTP.Addr = "127.0.0.1:0"
	cfg.Startup.Timeout = 2 * time.Minute
	var logs testenv.Buffer
	r := startWith(t, cfg, engine.Options{}, testenv.Log{To: &logs, JSON: true})
	base := "http://" + r.Addr(t, 30*time.Second)

	testenv.Eventually(t, 30*time.Second, func() bool {
		return len(logs.Lines(`"dependency":"PostgreSQL"`)) >= 2
	}, "two WARNs for PostgreSQL attempts:\n%s", logs.String())
	if code, body := probe(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("healthz while waiting = %d %q, want 200", code, body)
	}
	code, body := probe(t, base+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"state":"starting"`) || !strings.Contains(body, "PostgreSQL") {
		t.Errorf("readyz while waiting = %d %s, want 503 starting, naming PostgreSQL", code, body)
	}
	for _, line := range logs.Lines(`"dependency":"PostgreSQL"`) {
		if !strings.Contains(line, `"level":"WARN"`) || !strings.Contains(line, `"attempt":`) || !strings.Contains(line, `"reason":`) {
			t.Errorf("attempt line lacks level WARN, attempt or reason: %s", line)
		}
	}
	if strings.Contains(logs.String(), "s3cret-start") || strings.Contains(body, "s3cret-start") {
		t.Errorf("the password reached the log or /readyz")
	}

	proxy.Restore()
	g := &gen{}
	events := make([]*ratchetv1.Event, 300)
	for i := range events {
		events[i] = g.next()
	}
	newProducer(t, addr).send(t, events)
	pool := openPool(t, direct)
	testenv.Eventually(t, 60*time.Second, func() bool {
		return count(t, pool, `SELECT coalesce(sum(count),0) FROM dashboard_rollups`) >= int64(len(events))
	}, "all %d events applied after PostgreSQL came back", len(events))
	testenv.Eventually(t, 30*time.Second, func() bool {
		code, _ := probe(t, base+"/readyz")
		return code == http.StatusOK
	}, "readyz 200 once started")
	r.Stop(t)
}

// TestStartGivesUpOnPostgres: PostgreSQL stays unreachable longer than
// startup.timeout: the engine returns an error naming PostgreSQL and the
// timeout (exit 1), without the password, and no sooner than the timeout.
func TestStartGivesUpOnPostgres(t *testing.T) {
	_, addr := testenv.Kafka(t, 1, topic)
	proxy, dbURL := behindProxy(t, testenv.Postgres(t))
	proxy.Cut()
	cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
	cfg.Startup.Timeout = 3 * time.Second
	began := time.Now()
	r := startWith(t, cfg, engine.Options{}, testenv.Log{})
	err := r.Wait(t, 30*time.Second)
	took := time.Since(began)
	if err == nil {
		t.Fatal("engine started without PostgreSQL")
	}
	msg := err.Error()
	if !strings.Contains(msg, "PostgreSQL unreachable") || !strings.Contains(msg, "startup.timeout 3s") {
		t.Errorf("error %q does not name PostgreSQL and startup.timeout", msg)
	}
	if strings.Contains(msg, "s3cret-start") {
		t.Errorf("error %q shows the password", msg)
	}
	var ce *config.Error
	if errors.As(err, &ce) {
		t.Errorf("error %q is a configuration error (exit 2), want exit 1", msg)
	}
	if took < 3*time.Second || took > 15*time.Second {
		t.Errorf("gave up after %s, want about startup.timeout (3s)", took)
	}
}

// TestStartGivesUpOnKafka: the brokers are unreachable for longer than
// startup.timeout: the engine returns an error naming Kafka.
func TestStartGivesUpOnKafka(t *testing.T) {
	brokers, _ := closedPort(t)
	cfg := testConfig(t, brokers, testenv.Postgres(t), config.ModeExactlyOnce)
	cfg.Startup.Timeout = 3 * time.Second
	r := startWith(t, cfg, engine.Options{}, testenv.Log{})
	err := r.Wait(t, 30*time.Second)
	if err == nil || !strings.Contains(err.Error(), "Kafka unreachable") || !strings.Contains(err.Error(), "startup.timeout 3s") {
		t.Fatalf("engine returned %v, want an error naming Kafka and startup.timeout", err)
	}
}

// TestStartWaitsForKafka: no broker listens when the engine starts; it
// retries, and once the broker is up it starts and applies.
func TestStartWaitsForKafka(t *testing.T) {
	brokers, port := closedPort(t)
	dbURL := testenv.Postgres(t)
	cfg := testConfig(t, brokers, dbURL, config.ModeExactlyOnce)
	cfg.Startup.Timeout = 2 * time.Minute
	var logs testenv.Buffer
	r := startWith(t, cfg, engine.Options{}, testenv.Log{To: &logs, JSON: true})
	testenv.Eventually(t, 60*time.Second, func() bool {
		return len(logs.Lines(`"dependency":"Kafka"`)) >= 1
	}, "a WARN for a Kafka attempt:\n%s", logs.String())
	select {
	case <-r.Exited():
		t.Fatalf("engine exited while the broker was down: %v", r.Wait(t, 0))
	default:
	}

	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.AllowAutoTopicCreation(),
		kfake.SeedTopics(3, topic))
	if err != nil {
		t.Fatalf("start kfake on %d: %v", port, err)
	}
	t.Cleanup(c.Close)
	g := &gen{}
	events := make([]*ratchetv1.Event, 300)
	for i := range events {
		events[i] = g.next()
	}
	newProducer(t, brokers).send(t, events)
	pool := openPool(t, dbURL)
	testenv.Eventually(t, 90*time.Second, func() bool {
		return count(t, pool, `SELECT coalesce(sum(count),0) FROM dashboard_rollups`) >= int64(len(events))
	}, "all %d events applied after the broker came up", len(events))
	r.Stop(t)
}

// TestStopWhileWaitingForPostgres: a stop during the start-up wait (here
// startup.timeout 0: wait forever) ends it at once as a clean stop.
func TestStopWhileWaitingForPostgres(t *testing.T) {
	_, addr := testenv.Kafka(t, 1, topic)
	proxy, dbURL := behindProxy(t, testenv.Postgres(t))
	proxy.Cut()
	cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
	cfg.Startup.Timeout = 0
	var logs testenv.Buffer
	r := startWith(t, cfg, engine.Options{}, testenv.Log{To: &logs, JSON: true})
	testenv.Eventually(t, 30*time.Second, func() bool {
		return len(logs.Lines(`"dependency":"PostgreSQL"`)) >= 1
	}, "a WARN for a PostgreSQL attempt")
	r.Cancel()
	began := time.Now()
	if err := r.Wait(t, 5*time.Second); err != nil {
		t.Errorf("stop while waiting returned %v, want a clean stop", err)
	}
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("stop while waiting took %s", took)
	}
}

// TestBadConfigFailsBeforeConnecting: an invalid startup.timeout is a
// configuration error (exit 2) returned before any connection is tried,
// even with PostgreSQL and Kafka unreachable.
func TestBadConfigFailsBeforeConnecting(t *testing.T) {
	brokers, _ := closedPort(t)
	_, port := closedPort(t)
	cfg := config.Default()
	cfg.Kafka.Brokers = []string{brokers}
	cfg.Postgres.URL = config.SecretURL("postgres://postgres@127.0.0.1:" + strconv.Itoa(port) + "/x")
	cfg.HTTP.Addr = ""
	cfg.Startup.Timeout = -time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	began := time.Now()
	err := engine.Run(ctx, cfg, engine.Options{})
	var ce *config.Error
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "startup.timeout") {
		t.Fatalf("Run = %v, want a configuration error naming startup.timeout", err)
	}
	if took := time.Since(began); took > time.Second {
		t.Errorf("configuration error took %s: something was tried first", took)
	}
}

// TestStartRefusedByPostgresIsNotRetried: a failure no retry can mend (a
// database that does not exist) ends the start at once with exit 1, not
// after startup.timeout.
func TestStartRefusedByPostgresIsNotRetried(t *testing.T) {
	_, addr := testenv.Kafka(t, 1, topic)
	u, err := url.Parse(testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/ratchet_no_such_database"
	cfg := testConfig(t, addr, u.String(), config.ModeExactlyOnce)
	cfg.Startup.Timeout = time.Minute
	began := time.Now()
	r := startWith(t, cfg, engine.Options{}, testenv.Log{})
	err = r.Wait(t, 20*time.Second)
	if err == nil || !strings.Contains(err.Error(), "PostgreSQL refused, not retried") ||
		!strings.Contains(err.Error(), "ratchet_no_such_database") {
		t.Fatalf("engine returned %v, want PostgreSQL's refusal naming the database", err)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("refusal took %s: it was retried", took)
	}
}
