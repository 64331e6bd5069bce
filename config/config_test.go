package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// writeFile writes body to a YAML file in a temporary directory and
// returns its path.
func writeFile(tb testing.TB, body string) string {
	tb.Helper()
	p := filepath.Join(tb.TempDir(), "ratchet.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		tb.Fatal(err)
	}
	return p
}

// mustLoad loads and fails the test on any problem.
func mustLoad(tb testing.TB, path string, environ ...string) Config {
	tb.Helper()
	cfg, err := Load(path, environ)
	if err != nil {
		tb.Fatalf("load: %v", err)
	}
	return cfg
}

// problems loads and returns the problems, failing unless Load returned
// a *Error.
func problems(tb testing.TB, path string, environ ...string) *Error {
	tb.Helper()
	_, err := Load(path, environ)
	var ce *Error
	if !errors.As(err, &ce) {
		tb.Fatalf("want a *config.Error, got %v", err)
	}
	return ce
}

func TestDefaults(t *testing.T) {
	cfg := mustLoad(t, "")
	if !reflect.DeepEqual(cfg, Default()) {
		t.Errorf("Load with nothing differs from Default:\n%v\nwant\n%v", cfg, Default())
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"kafka.brokers", cfg.Kafka.Brokers, []string{"localhost:9092"}},
		{"kafka.group_id", cfg.Kafka.GroupID, "ratchet"},
		{"kafka.topics", cfg.Kafka.Topics, []string{"events"}},
		{"kafka.format", cfg.Kafka.Format, "protobuf"},
		{"kafka.topic_formats", cfg.Kafka.TopicFormats, map[string]string{}},
		{"kafka.dlq_topic", cfg.Kafka.DLQTopic("events"), "events.dlq"},
		{"kafka.instance_id", cfg.Kafka.InstanceID, ""},
		{"kafka.properties", cfg.Kafka.Properties, Properties{}},
		{"kafka.recycle_interval", cfg.Kafka.RecycleInterval, time.Duration(0)},
		{"kafka.auto_offset_reset", cfg.Kafka.AutoOffsetReset, "earliest"},
		{"postgres.url", cfg.Postgres.URL.Reveal(), "postgres://localhost:5432/ratchet"},
		{"postgres.max_conns", cfg.Postgres.MaxConns, 0},
		{"postgres.synchronous_commit", cfg.Postgres.SynchronousCommit, "on"},
		{"processing.batch_size", cfg.Processing.BatchSize, 500},
		{"processing.max_batch_size", cfg.Processing.MaxBatchSize, 0},
		{"processing.batch_linger", cfg.Processing.BatchLinger, 20 * time.Millisecond},
		{"processing.max_buffered_per_partition", cfg.Processing.MaxBufferedPerPartition, 10000},
		{"processing.memory_budget", cfg.Processing.MemoryBudget, ByteSize(32 << 20)},
		{"commit.mode", cfg.Commit.Mode, ModeExactlyOnce},
		{"commit.interval", cfg.Commit.Interval, time.Second},
		{"retry.initial_backoff", cfg.Retry.InitialBackoff, 100 * time.Millisecond},
		{"retry.max_backoff", cfg.Retry.MaxBackoff, 30 * time.Second},
		{"retry.max_attempts", cfg.Retry.MaxAttempts, 5},
		{"supervision.max_restarts", cfg.Supervision.MaxRestarts, 10},
		{"supervision.within", cfg.Supervision.Within, time.Minute},
		{"http.addr", cfg.HTTP.Addr, "127.0.0.1:8080"},
		{"shutdown.timeout", cfg.Shutdown.Timeout, 30 * time.Second},
		{"startup.timeout", cfg.Startup.Timeout, 5 * time.Minute},
		{"log.level", cfg.Log.Level, "info"},
		{"log.format", cfg.Log.Format, "json"},
		{"log.dead_letters", cfg.Log.DeadLetters, "summary"},
		{"log.dead_letter_interval", cfg.Log.DeadLetterInterval, 30 * time.Second},
		{"log.include_values", cfg.Log.IncludeValues, false},
		{"schema_registry.url", cfg.SchemaRegistry.URL.Reveal(), ""},
		{"schema_registry.username", cfg.SchemaRegistry.Username.Reveal(), ""},
		{"schema_registry.password", cfg.SchemaRegistry.Password.Reveal(), ""},
		{"tracing.enabled", cfg.Tracing.Enabled, false},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
		}
	}
	if len(checks) != len(keys) {
		t.Errorf("checked %d defaults, there are %d keys", len(checks), len(keys))
	}
}

func TestDefaultSharesNothing(t *testing.T) {
	a := Default()
	a.Kafka.Brokers[0] = "changed:1"
	a.Kafka.Properties["x"] = "y"
	b := Default()
	if b.Kafka.Brokers[0] != "localhost:9092" || len(b.Kafka.Properties) != 0 {
		t.Errorf("Default returned shared state: %v", b)
	}
}

func TestFileEveryKey(t *testing.T) {
	path := writeFile(t, `
kafka:
  brokers: [a:1, "b:2"]
  group_id: g
  topics:
    - clicks
    - views
  format: json
  topic_formats: {views: protobuf}
  dlq_topic: dead
  instance_id: pod-0
  properties:
    security.protocol: SASL_SSL
    sasl.password: pw
  recycle_interval: 1h
  auto_offset_reset: latest
postgres:
  url: postgresql://app@db:5433/x?sslmode=require
  max_conns: 8
  synchronous_commit: on
processing:
  batch_size: 100
  batch_linger: 5ms
  max_buffered_per_partition: 200
  memory_budget: 16MiB
commit:
  mode: at-least-once
  interval: 250ms
retry:
  initial_backoff: 1s
  max_backoff: 1m
  max_attempts: 3
supervision:
  max_restarts: 2
  within: 10s
http:
  addr: "127.0.0.1:0"
shutdown:
  timeout: 5s
startup:
  timeout: 0
log:
  level: debug
  format: text
  dead_letters: each
  dead_letter_interval: 1m
schema_registry:
  url: https://registry:8081
  username: key
  password: secret
`)
	got := mustLoad(t, path)
	want := Config{
		Kafka: Kafka{
			Brokers: []string{"a:1", "b:2"}, GroupID: "g", Topics: []string{"clicks", "views"}, Format: "json",
			TopicFormats: map[string]string{"views": "protobuf"}, DLQTopicName: "dead", InstanceID: "pod-0",
			Properties:      Properties{"security.protocol": "SASL_SSL", "sasl.password": "pw"},
			RecycleInterval: time.Hour, AutoOffsetReset: "latest",
		},
		Postgres:       Postgres{URL: "postgresql://app@db:5433/x?sslmode=require", MaxConns: 8, SynchronousCommit: "on"},
		Processing:     Processing{BatchSize: 100, BatchLinger: 5 * time.Millisecond, MaxBufferedPerPartition: 200, MemoryBudget: 16 << 20},
		Commit:         Commit{Mode: ModeAtLeastOnce, Interval: 250 * time.Millisecond},
		Retry:          Retry{InitialBackoff: time.Second, MaxBackoff: time.Minute, MaxAttempts: 3},
		Supervision:    Supervision{MaxRestarts: 2, Within: 10 * time.Second},
		HTTP:           HTTP{Addr: "127.0.0.1:0"},
		Shutdown:       Shutdown{Timeout: 5 * time.Second},
		Startup:        Startup{Timeout: 0},
		Log:            Log{Level: "debug", Format: "text", DeadLetters: "each", DeadLetterInterval: time.Minute},
		SchemaRegistry: SchemaRegistry{URL: "https://registry:8081", Username: "key", Password: "secret"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("loaded\n%v\nwant\n%v", got.Redacted(), want.Redacted())
	}
	if got.Kafka.DLQTopic("clicks") != "dead" || got.FormatFor("views") != "protobuf" || got.FormatFor("clicks") != "json" {
		t.Errorf("DLQTopic/FormatFor: %s %s %s", got.Kafka.DLQTopic("clicks"), got.FormatFor("views"), got.FormatFor("clicks"))
	}
}

func TestFileEdgeCases(t *testing.T) {
	cases := []struct {
		name, body string
		check      func(Config) bool
	}{
		{"empty file", "", func(c Config) bool { return reflect.DeepEqual(c, Default()) }},
		{"comments only", "# nothing\n", func(c Config) bool { return reflect.DeepEqual(c, Default()) }},
		{"empty section", "kafka:\nlog:\n  level: warn\n", func(c Config) bool { return c.Log.Level == "warn" && c.Kafka.GroupID == "ratchet" }},
		{"list as one string", "kafka:\n  brokers: a:1, b:2\n", func(c Config) bool { return reflect.DeepEqual(c.Kafka.Brokers, []string{"a:1", "b:2"}) }},
		{"empty http addr turns it off", "http:\n  addr: \"\"\n", func(c Config) bool { return c.HTTP.Addr == "" }},
		{"null http addr turns it off", "http:\n  addr:\n", func(c Config) bool { return c.HTTP.Addr == "" }},
		{"anchors and aliases", "kafka:\n  topics: &t [a, b]\n  group_id: &g grp\n  instance_id: *g\n", func(c Config) bool {
			return c.Kafka.InstanceID == "grp" && reflect.DeepEqual(c.Kafka.Topics, []string{"a", "b"})
		}},
		{"zero duration", "kafka:\n  recycle_interval: 0\n", func(c Config) bool { return c.Kafka.RecycleInterval == 0 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := mustLoad(t, writeFile(t, tc.body))
			if !tc.check(cfg) {
				t.Errorf("unexpected configuration:\n%v", cfg)
			}
		})
	}
}

func TestFileStrict(t *testing.T) {
	cases := []struct {
		name, body string
		want       []string
	}{
		{"unknown key", "kafka:\n  brokerz: [x:1]\n", []string{"kafka.brokerz: unknown key (did you mean kafka.brokers?)"}},
		{"unknown key far from any", "commit:\n  frobnicate: 1\n", []string{"commit.frobnicate: unknown key"}},
		{"unknown section", "kafak:\n  brokers: [x:1]\n", []string{"kafak: unknown key (did you mean kafka?)"}},
		{"flat key", "kafka.brokers: [x:1]\n", []string{"kafka.brokers: unknown key (write it nested: kafka: {brokers: ...})"}},
		{"section not a mapping", "kafka: [a]\n", []string{`kafka: "[a]" is not allowed (allowed: a mapping of kafka.* keys)`}},
		{"list of lists", "kafka:\n  topics: [[a]]\n", []string{"kafka.topics", "a list of strings"}},
		{"map not a mapping", "kafka:\n  properties: [a]\n", []string{"kafka.properties", "a mapping of names to values"}},
		{"scalar wanted", "log:\n  level: [debug]\n", []string{"log.level", "a single value"}},
		{"not yaml", "kafka: [\n", []string{"not valid YAML"}},
		{"not a mapping", "- a\n", []string{"not a YAML mapping of sections"}},
		{"several at once", "kafka:\n  brokerz: x\n  format: xml\nlog:\n  levle: debug\n", []string{
			"kafka.brokerz: unknown key", `kafka.format: "xml" is not allowed`, "log.levle: unknown key (did you mean log.level?)",
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ce := problems(t, writeFile(t, tc.body))
			for _, w := range tc.want {
				if !strings.Contains(ce.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, ce)
				}
			}
		})
	}
}

func TestMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.yaml")
	ce := problems(t, path)
	if want := path + ": cannot read the configuration file: no such file or directory"; ce.Error() != want {
		t.Errorf("got %q, want %q", ce, want)
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
http:
  addr: 127.0.0.1:9000
`)
	cfg := mustLoad(t, path,
		"RATCHET_PROCESSING_BATCH_SIZE=250",
		"RATCHET_KAFKA_TOPIC_FORMATS=views=json",
		"RATCHET_KAFKA_PROPERTIES=security.protocol=SASL_SSL,sasl.mechanism=PLAIN",
		"RATCHET_HTTP_ADDR=", // set but empty: turns the server off
		"HOME=/root",
	)
	if got := strings.Join(cfg.Kafka.Brokers, ","); got != "a:1,b:2" {
		t.Errorf("kafka.brokers %q, want the file's a:1,b:2", got)
	}
	if cfg.Processing.BatchSize != 250 {
		t.Errorf("processing.batch_size %d, want the environment's 250", cfg.Processing.BatchSize)
	}
	if cfg.Commit.Mode != ModeAtLeastOnce {
		t.Errorf("commit.mode %q, want the file's at-least-once", cfg.Commit.Mode)
	}
	// A map from the environment replaces the file's map; it does not merge.
	if want := (Properties{"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}); !reflect.DeepEqual(cfg.Kafka.Properties, want) {
		t.Errorf("kafka.properties %v, want %v", cfg.Kafka.Properties, want)
	}
	if cfg.HTTP.Addr != "" {
		t.Errorf("http.addr %q, want empty", cfg.HTTP.Addr)
	}
	if cfg.FormatFor("views") != "json" || cfg.FormatFor("clicks") != "protobuf" {
		t.Errorf("formats: views %s, clicks %s", cfg.FormatFor("views"), cfg.FormatFor("clicks"))
	}
}

// TestSynchronousCommitOffUnquoted: YAML 1.1 reads a bare off as false;
// the key must still get the string a user wrote.
func TestSynchronousCommitOffUnquoted(t *testing.T) {
	got := mustLoad(t, writeFile(t, "postgres:\n  synchronous_commit: off\n"))
	if got.Postgres.SynchronousCommit != "off" {
		t.Fatalf("postgres.synchronous_commit = %q, want off", got.Postgres.SynchronousCommit)
	}
}

func TestParseByteSize(t *testing.T) {
	cases := []struct {
		in   string
		want ByteSize
		text string // String of the result
		bad  bool
	}{
		{in: "64MiB", want: 64 << 20, text: "64MiB"},
		{in: "64 MiB", want: 64 << 20, text: "64MiB"},
		{in: "512KiB", want: 512 << 10, text: "512KiB"},
		{in: "1GiB", want: 1 << 30, text: "1GiB"},
		{in: "1536KiB", want: 1536 << 10, text: "1536KiB"},
		{in: "1048576", want: 1 << 20, text: "1MiB"},
		{in: "1000B", want: 1000, text: "1000B"},
		{in: "0", want: 0, text: "0B"},
		{in: "64MB", bad: true},
		{in: "-1MiB", bad: true},
		{in: "MiB", bad: true},
		{in: "99999999999GiB", bad: true},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			got, err := ParseByteSize(c.in)
			if c.bad {
				if err == nil {
					t.Fatalf("ParseByteSize(%q) = %d, want an error", c.in, got)
				}
				return
			}
			if err != nil || got != c.want || got.String() != c.text {
				t.Fatalf("ParseByteSize(%q) = %d (%s), %v; want %d (%s)", c.in, got, got, err, c.want, c.text)
			}
		})
	}
}

// A YAML syntax error names the line of the problem, not the line above
// the block it is in: a key mis-indented on line 44, in the fifth of a
// list of pipelines, is reported at line 44 (yaml says line 38, the line
// above that pipeline, or line 6 for a problem in the first pipeline).
func TestYAMLErrorNamesTheBadLine(t *testing.T) {
	pipeline := func(i int, keyIndent string) string {
		return fmt.Sprintf("  - name: p%d\n    topic: orders\n    format: json\n    upsert:\n      table: t%d\n"+
			"%skey: { id: string(record.key) }\n      columns:\n        a: value.a\n", i, i, keyIndent)
	}
	cases := []struct {
		name string
		bad  int // which pipeline has the mis-indented key
		line string
	}{
		{"fifth pipeline", 4, "line 44: did not find expected key (in the block from line 39)"},
		{"first pipeline", 0, "line 12: did not find expected key (in the block from line 7)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			body := "# pipelines\nkafka:\n  brokers: [a:1]\n  topics: [orders]\n\npipelines:\n"
			for i := range 6 {
				indent := "      "
				if i == tc.bad {
					indent = "     "
				}
				body += pipeline(i, indent)
			}
			if got := strings.Split(body, "\n")[tc.bad*8+11]; !strings.HasPrefix(got, "     key:") {
				t.Fatalf("the bad line is %q", got)
			}
			ce := problems(t, writeFile(t, body))
			if want := "not valid YAML: " + tc.line; !strings.Contains(ce.Error(), want) {
				t.Fatalf("got %q, want it to contain %q", ce, want)
			}
		})
	}
}

// TestMaxBatch: the most records a transaction of a partition that is
// behind takes: 4 × batch_size unless set, never below batch_size, never
// above the bound of batch_size itself.
func TestMaxBatch(t *testing.T) {
	for _, tc := range []struct {
		batch, max, want int
	}{
		{500, 0, 2000},
		{500, 500, 500},
		{500, 3000, 3000},
		{1, 0, 4},
		{60000, 0, 100000},
		{100000, 0, 100000},
	} {
		p := Processing{BatchSize: tc.batch, MaxBatchSize: tc.max}
		if got := p.MaxBatch(); got != tc.want {
			t.Errorf("batch_size %d, max_batch_size %d: MaxBatch %d, want %d", tc.batch, tc.max, got, tc.want)
		}
	}
}
