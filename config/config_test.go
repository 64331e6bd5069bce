package config

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeFile(tb testing.TB, body string) string {
	tb.Helper()
	p := filepath.Join(tb.TempDir(), "ratchet.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		tb.Fatal(err)
	}
	return p
}

func TestDefaultsAreValid(t *testing.T) {
	cfg, err := Load("", nil)
	if err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if cfg.Kafka.DLQTopic("events") != "events.dlq" || cfg.Commit.Mode != ModeExactlyOnce ||
		cfg.Processing.BatchSize != 500 || cfg.Commit.Interval != time.Second || cfg.HTTP.Addr != "127.0.0.1:8080" {
		t.Errorf("unexpected defaults: %v", cfg)
	}
}

func TestEnvironmentWinsOverFile(t *testing.T) {
	path := writeFile(t, `
kafka:
  brokers: [a:1, b:2]
  topics: [clicks, views]
  properties: {security.protocol: SSL}
processing:
  batch_size: 100
commit:
  mode: at-least-once
`)
	cfg, err := Load(path, []string{"RATCHET_PROCESSING_BATCH_SIZE=250", "RATCHET_KAFKA_TOPIC_FORMATS=views=json",
		"RATCHET_TEST_POSTGRES_URL=ignored", "HOME=/root"})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Kafka.Brokers, ","); got != "a:1,b:2" {
		t.Errorf("brokers %q", got)
	}
	if cfg.Processing.BatchSize != 250 {
		t.Errorf("batch_size %d, want the environment's 250", cfg.Processing.BatchSize)
	}
	if cfg.Commit.Mode != ModeAtLeastOnce || cfg.Kafka.Properties["security.protocol"] != "SSL" {
		t.Errorf("file values lost: %v", cfg)
	}
	if cfg.FormatFor("views") != "json" || cfg.FormatFor("clicks") != "protobuf" {
		t.Errorf("formats: views %s clicks %s", cfg.FormatFor("views"), cfg.FormatFor("clicks"))
	}
}

func TestBadValuesNameTheKey(t *testing.T) {
	cases := []struct {
		name, file string
		env        []string
		want       []string
	}{
		{"format", "", []string{"RATCHET_KAFKA_FORMAT=xml"}, []string{`kafka.format (RATCHET_KAFKA_FORMAT): "xml" is not allowed (allowed: protobuf, json)`}},
		{"batch size", "", []string{"RATCHET_PROCESSING_BATCH_SIZE=-1"}, []string{"processing.batch_size", `"-1"`}},
		{"not an int", "", []string{"RATCHET_RETRY_MAX_ATTEMPTS=many"}, []string{"retry.max_attempts (RATCHET_RETRY_MAX_ATTEMPTS)", "an integer"}},
		{"duration", "", []string{"RATCHET_COMMIT_INTERVAL=soon"}, []string{"commit.interval", `"soon"`, "a duration"}},
		{"mode", "commit:\n  mode: twice\n", nil, []string{`commit.mode: "twice"`, "exactly-once, at-least-once"}},
		{"url", "", []string{"RATCHET_POSTGRES_URL=mysql://u:hunter2@db/x"}, []string{"postgres.url", "REDACTED"}},
		{"http addr", "", []string{"RATCHET_HTTP_ADDR=nonsense"}, []string{"http.addr", `"nonsense"`}},
		{"backoff order", "retry:\n  initial_backoff: 10s\n  max_backoff: 1s\n", nil, []string{"retry.max_backoff", ">= retry.initial_backoff"}},
		{"unknown yaml key", "kafka:\n  brokerz: [x:1]\n", nil, []string{"kafka.brokerz: unknown key"}},
		{"unknown env", "", []string{"RATCHET_KAFKA_BROKER=x:1"}, []string{"RATCHET_KAFKA_BROKER: unknown variable"}},
		{"managed property", "kafka:\n  properties: {enable.auto.commit: 'true'}\n", nil, []string{"kafka.properties.enable.auto.commit"}},
		{"shutdown", "", []string{"RATCHET_SHUTDOWN_TIMEOUT=0s"}, []string{"shutdown.timeout"}},
		{"brokers", "", []string{"RATCHET_KAFKA_BROKERS=nohost"}, []string{`kafka.brokers (RATCHET_KAFKA_BROKERS): "nohost"`, "host:port"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := ""
			if tc.file != "" {
				path = writeFile(t, tc.file)
			}
			_, err := Load(path, tc.env)
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("want *Error, got %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("password in error: %q", err)
			}
		})
	}
}

func TestEveryProblemAtOnce(t *testing.T) {
	_, err := Load("", []string{"RATCHET_KAFKA_FORMAT=xml", "RATCHET_PROCESSING_BATCH_SIZE=0", "RATCHET_LOG_LEVEL=loud"})
	var ce *Error
	if !errors.As(err, &ce) || len(ce.Problems) != 3 {
		t.Fatalf("want 3 problems, got %v", err)
	}
	if n := len(strings.Split(err.Error(), "\n")); n != 3 {
		t.Errorf("want one line per problem, got %d lines: %q", n, err)
	}
}

func TestSecretsNeverPrinted(t *testing.T) {
	const pw = "s3cr3t-planted"
	cfg, err := Load("", []string{
		"RATCHET_POSTGRES_URL=postgres://app:" + pw + "@db:5432/ratchet?sslmode=require",
		"RATCHET_KAFKA_PROPERTIES=sasl.mechanism=SCRAM-SHA-512,sasl.username=u,sasl.password=" + pw,
	})
	if err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("config", "config", cfg, "url", cfg.Postgres.URL)
	outputs := map[string]string{
		"%v": fmt.Sprintf("%v", cfg), "%+v": fmt.Sprintf("%+v", cfg), "%#v": fmt.Sprintf("%#v", cfg),
		"%s url": fmt.Sprintf("%s", cfg.Postgres.URL), "props": fmt.Sprint(cfg.Kafka.Properties),
		"slog": logs.String(),
	}
	for name, out := range outputs {
		if strings.Contains(out, pw) {
			t.Errorf("%s reveals the password: %s", name, out)
		}
		if !strings.Contains(out, "REDACTED") {
			t.Errorf("%s shows no REDACTED marker: %s", name, out)
		}
	}
	if !strings.Contains(cfg.Postgres.URL.Reveal(), pw) {
		t.Error("Reveal must return the real URL")
	}
}

func TestReferenceDefaultsMatchDefault(t *testing.T) {
	d := Default()
	shown := map[string]string{}
	for _, f := range d.orderedFields() {
		shown[f.key] = f.display()
	}
	for _, k := range Reference() {
		want := shown[k.Key]
		if want == "" {
			want = "(empty)"
		}
		if k.Default != want || k.Env != envName(k.Key) || k.Meaning == "" {
			t.Errorf("%s: documented %+v, Default() has %q", k.Key, k, want)
		}
	}
	// Every documented default must load back to the same value.
	var env []string
	for _, k := range Reference() {
		if k.Default != "(empty)" && k.Default != "{}" {
			env = append(env, k.Env+"="+k.Default)
		}
	}
	cfg, err := Load("", env)
	if err != nil {
		t.Fatalf("documented defaults do not load: %v", err)
	}
	if cfg.String() != d.String() {
		t.Errorf("documented defaults load as\n%s\nwant\n%s", cfg, d)
	}
}

func TestReadmeConfigReference(t *testing.T) {
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatalf("README.md: %v", err)
	}
	const begin, end = "<!-- config-reference:begin -->\n", "<!-- config-reference:end -->"
	s := string(raw)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("README.md has no %q ... %q section", strings.TrimSpace(begin), end)
	}
	if got, want := s[i+len(begin):j], ReferenceMarkdown(); got != want {
		t.Errorf("README configuration reference is out of date; replace it with:\n%s", want)
	}
}
