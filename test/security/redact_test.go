package security

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"ratchet/config"
	"ratchet/internal/cli"
	"ratchet/internal/event"
	"ratchet/internal/schemareg"
	"ratchet/internal/testenv"
)

// planted are the secrets no output may show.
var planted = []string{pgPassword, saslPassword}

// assertNoPlanted fails the test when text shows any planted secret.
func assertNoPlanted(tb testing.TB, what, text string) {
	tb.Helper()
	for _, s := range planted {
		assertNoSecret(tb, what, text, s)
	}
}

// cliRun is one `ratchet` command run in process.
type cliRun struct {
	cancel context.CancelFunc
	done   chan int
	stdout *testenv.Buffer
	stderr *testenv.Buffer
}

// startCLI runs cli.Run(args, environ) in the background; its context ends
// when the test does, or at stop.
func startCLI(tb testing.TB, args, environ []string) *cliRun {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &cliRun{cancel: cancel, done: make(chan int, 1), stdout: &testenv.Buffer{}, stderr: &testenv.Buffer{}}
	go func() { r.done <- cli.Run(ctx, args, environ, r.stdout, r.stderr) }() // ends when ctx is done
	tb.Cleanup(func() { r.stop(tb) })
	return r
}

// wait returns the exit code once the command ends by itself; it fails the
// test after timeout.
func (r *cliRun) wait(tb testing.TB, timeout time.Duration) int {
	tb.Helper()
	select {
	case code := <-r.done:
		r.done <- code
		return code
	case <-time.After(timeout):
		r.cancel()
		tb.Fatalf("command still running after %s; stderr:\n%s", timeout, tail(r.stderr.String(), 4000))
		return -1
	}
}

// stop cancels the command and returns its exit code.
func (r *cliRun) stop(tb testing.TB) int {
	tb.Helper()
	r.cancel()
	return r.wait(tb, 60*time.Second)
}

// listenAddr waits for the "http listening" log line of a JSON logger and
// returns its address.
func listenAddr(tb testing.TB, r *cliRun) string {
	tb.Helper()
	var addr string
	testenv.Eventually(tb, 60*time.Second, func() bool {
		for _, line := range strings.Split(r.stderr.String(), "\n") {
			var rec struct{ Msg, Addr string }
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "http listening" {
				addr = rec.Addr
				return true
			}
		}
		select {
		case code := <-r.done:
			r.done <- code
			tb.Fatalf("ratchet run exited with %d before listening:\n%s", code, tail(r.stderr.String(), 4000))
		default:
		}
		return false
	}, "ratchet run listens")
	return addr
}

// get fetches url and returns the body; it fails the test unless the
// status is 200 (or 503 for /readyz, which may say not ready).
func get(tb testing.TB, url string) string {
	tb.Helper()
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		tb.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("GET %s: %v", url, err)
	}
	if resp.StatusCode != http.StatusOK && !(strings.HasSuffix(url, "/readyz") && resp.StatusCode == http.StatusServiceUnavailable) {
		tb.Fatalf("GET %s: %s\n%s", url, resp.Status, body)
	}
	return string(body)
}

// TestSecretsRedactedEverywhere runs `ratchet run` with a password planted
// in postgres.url and another in kafka.properties (sasl.password, against
// a broker that requires it), at debug level with librdkafka's own
// configuration and security debugging on, applies good and poison
// records, and checks that neither password shows in any log line, page,
// probe or metric.
func TestSecretsRedactedEverywhere(t *testing.T) {
	cluster, addr := testenv.KafkaSASL(t, 3, scram256, saslUser, saslPassword, topic)
	base := testenv.Postgres(t)
	dbURL := withPassword(t, base, nil)
	props := saslProps(saslPassword)
	const good, poison = 300, 7
	produceAll(t, addr, props, encode(t, events(good), poison))

	environ := []string{
		"RATCHET_KAFKA_BROKERS=" + addr,
		"RATCHET_KAFKA_GROUP_ID=ratchet-redact",
		"RATCHET_POSTGRES_URL=" + dbURL,
		"RATCHET_HTTP_ADDR=127.0.0.1:0",
		"RATCHET_LOG_LEVEL=debug",
		"RATCHET_LOG_FORMAT=json",
		"RATCHET_SHUTDOWN_TIMEOUT=10s",
		"RATCHET_RETRY_INITIAL_BACKOFF=10ms",
		"RATCHET_RETRY_MAX_BACKOFF=100ms",
	}
	// The properties go in the file: debug's value has commas.
	file := filepath.Join(t.TempDir(), "ratchet.yaml")
	yaml := "kafka:\n  properties:\n" +
		"    security.protocol: SASL_PLAINTEXT\n    sasl.mechanism: SCRAM-SHA-256\n" +
		"    sasl.username: " + saslUser + "\n    sasl.password: " + saslPassword + "\n" +
		"    debug: conf,security,broker\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startCLI(t, []string{"run", "--config", file}, environ)
	web := "http://" + listenAddr(t, r)

	pool := openPool(t, base)
	waitApplied(t, pool, good)
	waitDeadLettered(t, cluster, topic+".dlq", poison)
	testenv.Eventually(t, 30*time.Second, func() bool {
		return count(pool, `SELECT count(*) FROM ratchet_dead_letters`) >= poison
	}, "%d dead letters recorded", poison)

	pages := map[string]string{}
	for _, path := range []string{"/", "/api/state", "/readyz", "/healthz", "/metrics"} {
		pages[path] = get(t, web+path)
		assertNoPlanted(t, "GET "+path, pages[path])
	}
	if !strings.Contains(pages["/metrics"], "ratchet_") {
		t.Errorf("/metrics shows no ratchet metric:\n%s", tail(pages["/metrics"], 2000))
	}
	if code := r.stop(t); code != cli.ExitOK {
		t.Errorf("ratchet run exited with %d after a stop, want %d", code, cli.ExitOK)
	}
	logs := r.stderr.String()
	for _, want := range []string{`"msg":"ratchet starting"`, `"sasl.password":"REDACTED"`,
		"Client configuration:", `"tag":"SASL"`} {
		// The configuration is logged (redacted) and librdkafka's
		// debugging ran; otherwise the check below proves nothing.
		if !strings.Contains(logs, want) {
			t.Errorf("logs do not contain %q", want)
		}
	}
	assertNoPlanted(t, "logs", logs)
	assertNoPlanted(t, "stdout", r.stdout.String())
}

// TestSecretsRedactedInFailures runs `ratchet run` (and the other commands
// that connect) with configurations that fail, each carrying a planted
// password, and checks the exit code and that stderr names the problem
// without the password.
func TestSecretsRedactedInFailures(t *testing.T) {
	t.Parallel()
	_, saslAddr := testenv.KafkaSASL(t, 1, scram256, saslUser, "the-right-one", topic)
	base := testenv.Postgres(t)
	dbURL := withPassword(t, base, nil)
	dir := t.TempDir()
	writeFile := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	closedPG := "postgres://postgres:" + pgPassword + "@127.0.0.1:1/ratchet?sslmode=disable&connect_timeout=2"
	sasl := "security.protocol=SASL_PLAINTEXT,sasl.mechanism=SCRAM-SHA-256,sasl.username=admin,sasl.password=" + saslPassword

	cases := []struct {
		name     string
		args     []string
		environ  []string
		wantCode int
		wantErr  string // in stderr
	}{
		{name: "bad postgres.url scheme", args: []string{"run"},
			environ:  []string{"RATCHET_POSTGRES_URL=mysql://postgres:" + pgPassword + "@127.0.0.1:5432/x"},
			wantCode: cli.ExitConfig, wantErr: "postgres.url"},
		{name: "bad sslmode", args: []string{"run"},
			environ:  []string{"RATCHET_POSTGRES_URL=postgres://postgres:" + pgPassword + "@127.0.0.1:5432/x?sslmode=maybe"},
			wantCode: cli.ExitConfig, wantErr: "sslmode"},
		{name: "password in a query parameter, bad sslmode", args: []string{"run"},
			environ:  []string{"RATCHET_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/x?sslmode=maybe&password=" + pgPassword},
			wantCode: cli.ExitConfig, wantErr: "sslmode"},
		{name: "key=value dsn", args: []string{"run"},
			environ:  []string{"RATCHET_POSTGRES_URL=host=127.0.0.1 password=" + pgPassword + " sslmode=maybe"},
			wantCode: cli.ExitConfig, wantErr: "postgres.url"},
		{name: "malformed url", args: []string{"run"},
			environ:  []string{"RATCHET_POSTGRES_URL=postgres://postgres:" + pgPassword + "@127.0.0.1:notaport/x"},
			wantCode: cli.ExitConfig, wantErr: "postgres.url"},
		{name: "closed postgres port", args: []string{"run"},
			// An unreachable database is waited for until startup.timeout.
			environ:  []string{"RATCHET_POSTGRES_URL=" + closedPG, "RATCHET_HTTP_ADDR=", "RATCHET_STARTUP_TIMEOUT=2s"},
			wantCode: cli.ExitError, wantErr: "127.0.0.1:1"},
		{name: "closed postgres port, migrate", args: []string{"migrate"},
			environ:  []string{"RATCHET_POSTGRES_URL=" + closedPG},
			wantCode: cli.ExitError, wantErr: "127.0.0.1:1"},
		{name: "closed postgres port, offsets", args: []string{"offsets"},
			environ:  []string{"RATCHET_POSTGRES_URL=" + closedPG, "RATCHET_KAFKA_BROKERS=" + saslAddr, "RATCHET_KAFKA_PROPERTIES=" + sasl},
			wantCode: cli.ExitError, wantErr: "127.0.0.1:1"},
		{name: "unparsable kafka.properties", args: []string{"run"},
			environ:  []string{"RATCHET_KAFKA_PROPERTIES=sasl.password=" + saslPassword + ",oops"},
			wantCode: cli.ExitConfig, wantErr: "kafka.properties"},
		{name: "refused kafka.properties override with a secret", args: []string{"run"},
			environ:  []string{"RATCHET_KAFKA_PROPERTIES=enable.auto.commit=true,sasl.password=" + saslPassword},
			wantCode: cli.ExitConfig, wantErr: "enable.auto.commit"},
		{name: "wrong sasl password", args: []string{"run"},
			environ: []string{"RATCHET_POSTGRES_URL=" + dbURL, "RATCHET_HTTP_ADDR=",
				"RATCHET_KAFKA_BROKERS=" + saslAddr, "RATCHET_KAFKA_PROPERTIES=" + sasl, "RATCHET_LOG_LEVEL=debug"},
			wantCode: cli.ExitError, wantErr: "read topics"},
		{name: "yaml file with both secrets and a bad key", args: []string{"run", "--config", writeFile("bad.yaml", `
kafka:
  properties:
    sasl.password: `+saslPassword+`
    sasl.mechanism: SCRAM-SHA-256
  batch_size: 3
postgres:
  url: postgres://postgres:`+pgPassword+`@127.0.0.1:5432/x?sslmode=nope
`)}, wantCode: cli.ExitConfig, wantErr: "kafka.batch_size"},
		{name: "yaml file with secrets in the wrong shape", args: []string{"run", "--config", writeFile("shape.yaml", `
kafka:
  properties: [sasl.password, `+saslPassword+`]
postgres:
  url: [postgres://postgres:`+pgPassword+`@127.0.0.1:5432/x]
`)}, wantCode: cli.ExitConfig, wantErr: "kafka.properties"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := startCLI(t, tc.args, tc.environ)
			code := r.wait(t, 45*time.Second)
			stderr := r.stderr.String()
			t.Logf("exit %d; stderr ends:\n%s", code, lastLines(stderr, 3))
			if code != tc.wantCode {
				t.Errorf("exit code %d, want %d", code, tc.wantCode)
			}
			if !strings.Contains(stderr, tc.wantErr) {
				t.Errorf("stderr does not name %q", tc.wantErr)
			}
			assertNoPlanted(t, "stderr", stderr)
			assertNoPlanted(t, "stdout", r.stdout.String())
		})
	}
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// TestRegistryTokenRedacted runs `ratchet run` against a schema registry
// that accepts a token alone in the URL's user information
// (http://TOKEN@host, sent as the basic-auth user), applies framed records
// and dead-letters one with an unknown schema id, and checks that the
// token shows in no log line, page, probe or metric, while the URL is
// logged with REDACTED in its place.
func TestRegistryTokenRedacted(t *testing.T) {
	const token = "t0ken-planted"
	cluster, addr := testenv.Kafka(t, 2, topic)
	dbURL := testenv.Postgres(t)
	reg := testenv.NewRegistry(t, token, "")
	regURL := "http://" + token + "@" + reg.Addr()
	frame, id, err := schemareg.RegisterEvent(config.SchemaRegistry{URL: config.SecretURL(regURL)}, topic, event.FormatProtobuf)
	if err != nil {
		t.Fatalf("register: %v", err)
	}
	const good = 50
	var recs []record
	for _, r := range encode(t, events(good), 0) {
		recs = append(recs, record{key: r.key, value: append(append([]byte(nil), frame...), r.value...)})
	}
	payload := recs[0].value[len(frame):]
	recs = append(recs, record{key: []byte("unknown-id"), value: append(event.AppendFrame(nil, int32(id)+100, []int{0}), payload...)})
	produceAll(t, addr, nil, recs)

	r := startCLI(t, []string{"run"}, []string{
		"RATCHET_KAFKA_BROKERS=" + addr,
		"RATCHET_KAFKA_GROUP_ID=ratchet-registry-token",
		"RATCHET_POSTGRES_URL=" + dbURL,
		"RATCHET_SCHEMA_REGISTRY_URL=" + regURL,
		"RATCHET_HTTP_ADDR=127.0.0.1:0",
		"RATCHET_LOG_LEVEL=debug",
		"RATCHET_LOG_FORMAT=json",
		"RATCHET_SHUTDOWN_TIMEOUT=10s",
	})
	web := "http://" + listenAddr(t, r)
	waitApplied(t, openPool(t, dbURL), good)
	waitDeadLettered(t, cluster, topic+".dlq", 1)
	for _, path := range []string{"/", "/api/state", "/readyz", "/healthz", "/metrics"} {
		assertNoSecret(t, "GET "+path, get(t, web+path), token)
	}
	if code := r.stop(t); code != cli.ExitOK {
		t.Errorf("ratchet run exited with %d after a stop, want %d", code, cli.ExitOK)
	}
	logs := r.stderr.String()
	if want := "http://REDACTED@" + reg.Addr(); !strings.Contains(logs, want) {
		t.Errorf("logs do not show the registry URL as %s", want)
	}
	assertNoSecret(t, "logs", logs, token)
	assertNoSecret(t, "stdout", r.stdout.String(), token)
}
