package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestBadValuesNameTheKey(t *testing.T) {
	cases := []struct {
		name string
		file string   // YAML, or "" for none
		env  []string // KEY=VALUE
		want string   // the whole line, or a part of it
	}{
		{"format from env", "", []string{"RATCHET_KAFKA_FORMAT=xml"},
			`kafka.format (RATCHET_KAFKA_FORMAT): "xml" is not allowed (allowed: protobuf, json, raw)`},
		{"format from file", "kafka:\n  format: xml\n", nil,
			`kafka.format: "xml" is not allowed (allowed: protobuf, json, raw)`},
		{"registry not http", "", []string{"RATCHET_SCHEMA_REGISTRY_URL=registry:8081"},
			`schema_registry.url (RATCHET_SCHEMA_REGISTRY_URL): "registry:8081" is not allowed (allowed: an http:// or https:// URL with a host`},
		{"registry bad port", "schema_registry:\n  url: http://registry:0\n", nil,
			`schema_registry.url: "http://registry:0" is not allowed (allowed: a port of 1..65535)`},
		{"registry user without url", "", []string{"RATCHET_SCHEMA_REGISTRY_USERNAME=key"},
			`schema_registry.username (RATCHET_SCHEMA_REGISTRY_USERNAME): "REDACTED" is not allowed (allowed: empty unless schema_registry.url is set)`},
		{"registry password without user", "", []string{"RATCHET_SCHEMA_REGISTRY_URL=http://r:8081", "RATCHET_SCHEMA_REGISTRY_PASSWORD=x"},
			`schema_registry.username: "" is not allowed (allowed: the user the password belongs to`},
		{"registry unknown key", "", []string{"RATCHET_SCHEMA_REGISTRY_USER=key"},
			`RATCHET_SCHEMA_REGISTRY_USER: unknown variable`},
		{"negative batch size", "", []string{"RATCHET_PROCESSING_BATCH_SIZE=-1"},
			`processing.batch_size (RATCHET_PROCESSING_BATCH_SIZE): "-1" is not allowed (allowed: 1..100000)`},
		{"huge batch size", "processing:\n  batch_size: 100001\n  max_buffered_per_partition: 200000\n", nil,
			`processing.batch_size: "100001" is not allowed (allowed: 1..100000)`},
		{"max batch below batch", "processing:\n  batch_size: 1000\n  max_batch_size: 999\n", nil,
			`processing.max_batch_size: "999" is not allowed (allowed: 0 (4 × processing.batch_size), or processing.batch_size (1000)..100000)`},
		{"huge max batch", "", []string{"RATCHET_PROCESSING_MAX_BATCH_SIZE=100001"},
			`processing.max_batch_size (RATCHET_PROCESSING_MAX_BATCH_SIZE): "100001" is not allowed (allowed: 0 (4 × processing.batch_size), or processing.batch_size (500)..100000)`},
		{"negative max batch", "", []string{"RATCHET_PROCESSING_MAX_BATCH_SIZE=-5"},
			`processing.max_batch_size (RATCHET_PROCESSING_MAX_BATCH_SIZE): "-5" is not allowed (allowed: 0 (4 × processing.batch_size), or processing.batch_size (500)..100000)`},
		{"not an int", "", []string{"RATCHET_RETRY_MAX_ATTEMPTS=many"},
			`retry.max_attempts (RATCHET_RETRY_MAX_ATTEMPTS): "many" is not allowed (allowed: an integer)`},
		{"zero attempts", "retry:\n  max_attempts: 0\n", nil,
			`retry.max_attempts: "0" is not allowed (allowed: >= 1)`},
		{"not a duration", "", []string{"RATCHET_COMMIT_INTERVAL=soon"},
			`commit.interval (RATCHET_COMMIT_INTERVAL): "soon" is not allowed (allowed: a duration such as 250ms, 5s or 1m)`},
		{"duration without unit", "processing:\n  batch_linger: 20\n", nil,
			`processing.batch_linger: "20" is not allowed (allowed: a duration such as 250ms, 5s or 1m)`},
		{"linger too long", "", []string{"RATCHET_PROCESSING_BATCH_LINGER=11s"},
			`processing.batch_linger (RATCHET_PROCESSING_BATCH_LINGER): "11s" is not allowed (allowed: 0..10s)`},
		{"commit interval too short", "commit:\n  interval: 1ms\n", nil,
			`commit.interval: "1ms" is not allowed (allowed: 10ms..1h)`},
		{"commit mode", "commit:\n  mode: twice\n", nil,
			`commit.mode: "twice" is not allowed (allowed: exactly-once, at-least-once)`},
		{"buffer below batch", "processing:\n  batch_size: 1000\n  max_buffered_per_partition: 999\n", nil,
			`processing.max_buffered_per_partition: "999" is not allowed (allowed: >= processing.batch_size (1000))`},
		{"budget without unit it knows", "", []string{"RATCHET_PROCESSING_MEMORY_BUDGET=64MB"},
			`processing.memory_budget (RATCHET_PROCESSING_MEMORY_BUDGET): "64MB" is not allowed (allowed: a size such as 64MiB, 512KiB, 1GiB or a number of bytes)`},
		{"budget too small", "processing:\n  memory_budget: 512KiB\n", nil,
			`processing.memory_budget: "512KiB" is not allowed (allowed: 1MiB..64GiB)`},
		{"budget too large", "", []string{"RATCHET_PROCESSING_MEMORY_BUDGET=65GiB"},
			`processing.memory_budget (RATCHET_PROCESSING_MEMORY_BUDGET): "65GiB" is not allowed (allowed: 1MiB..64GiB)`},
		{"backoff order", "retry:\n  initial_backoff: 10s\n  max_backoff: 1s\n", nil,
			`retry.max_backoff: "1s" is not allowed (allowed: >= retry.initial_backoff (10s))`},
		{"not postgres", "", []string{"RATCHET_POSTGRES_URL=mysql://u:hunter2@db/x"},
			`postgres.url (RATCHET_POSTGRES_URL): "mysql://u:REDACTED@db/x" is not allowed (allowed: a postgres:// or postgresql:// URL with a host, e.g. postgres://user@db:5432/ratchet)`},
		{"postgres without host", "postgres:\n  url: postgres:///x\n", nil, `postgres.url: "postgres:///x" is not allowed`},
		{"postgres bad sslmode", "postgres:\n  url: postgres://db/x?sslmode=sometimes\n", nil, `(allowed: sslmode one of disable, allow`},
		{"negative max conns", "", []string{"RATCHET_POSTGRES_MAX_CONNS=-2"}, `postgres.max_conns (RATCHET_POSTGRES_MAX_CONNS): "-2" is not allowed (allowed: >= 0)`},
		{"synchronous commit", "", []string{"RATCHET_POSTGRES_SYNCHRONOUS_COMMIT=local"},
			`postgres.synchronous_commit (RATCHET_POSTGRES_SYNCHRONOUS_COMMIT): "local" is not allowed (allowed: on, off)`},
		{"asynchronous commit at least once", "postgres:\n  synchronous_commit: \"off\"\ncommit:\n  mode: at-least-once\n", nil,
			`postgres.synchronous_commit: "off" is not allowed (allowed: on with commit.mode at-least-once`},
		{"tracing not a bool", "", []string{"RATCHET_TRACING_ENABLED=yes"},
			`tracing.enabled (RATCHET_TRACING_ENABLED): "yes" is not allowed (allowed: true or false)`},
		{"include values not a bool", "log:\n  include_values: some\n", nil,
			`log.include_values: "some" is not allowed (allowed: true or false)`},
		{"tracing not a bool in the file", "tracing:\n  enabled: sometimes\n", nil,
			`tracing.enabled: "sometimes" is not allowed (allowed: true or false)`},
		{"http addr", "", []string{"RATCHET_HTTP_ADDR=nonsense"}, `http.addr (RATCHET_HTTP_ADDR): "nonsense" is not allowed`},
		{"http port", "http:\n  addr: 127.0.0.1:99999\n", nil, `http.addr: "127.0.0.1:99999" is not allowed`},
		{"http no host", "http:\n  addr: :8080\n", nil, `http.addr: ":8080" is not allowed (allowed: an explicit host`},
		{"shutdown", "", []string{"RATCHET_SHUTDOWN_TIMEOUT=0s"}, `shutdown.timeout (RATCHET_SHUTDOWN_TIMEOUT): "0" is not allowed (allowed: more than 0, at most 1h)`},
		{"startup negative", "", []string{"RATCHET_STARTUP_TIMEOUT=-1s"}, `startup.timeout (RATCHET_STARTUP_TIMEOUT): "-1s" is not allowed (allowed: 0 (wait forever), or 1s to 24h)`},
		{"startup too short", "startup:\n  timeout: 10ms\n", nil, `startup.timeout: "10ms" is not allowed (allowed: 0 (wait forever), or 1s to 24h)`},
		{"broker without port", "", []string{"RATCHET_KAFKA_BROKERS=a:1,nohost"},
			`kafka.brokers (RATCHET_KAFKA_BROKERS): "nohost" is not allowed (allowed: host:port with a port of 1..65535)`},
		{"no brokers", "", []string{"RATCHET_KAFKA_BROKERS= , "}, `kafka.brokers (RATCHET_KAFKA_BROKERS): "" is not allowed (allowed: one or more host:port)`},
		{"bad topic", "kafka:\n  topics: [ok, \"bad topic\"]\n", nil, `kafka.topics: "bad topic" is not allowed`},
		{"duplicate topic", "kafka:\n  topics: [a, a]\n", nil, `kafka.topics: "a" is not allowed (allowed: each topic once)`},
		{"input is a dlq", "kafka:\n  topics: [a, a.dlq]\n", nil, `kafka.topics: "a.dlq" is not allowed (allowed: input topics other than the dead-letter topic of a`},
		{"dlq is an input", "kafka:\n  topics: [a, b]\n  dlq_topic: b\n", nil, `kafka.dlq_topic: "b" is not allowed (allowed: a topic that is not an input topic)`},
		{"topic format of unknown topic", "", []string{"RATCHET_KAFKA_TOPIC_FORMATS=clicks=json"},
			`kafka.topic_formats (RATCHET_KAFKA_TOPIC_FORMATS): "clicks" is not allowed (allowed: topics listed in kafka.topics (events))`},
		{"topic format value", "kafka:\n  topic_formats: {events: avro}\n", nil,
			`kafka.topic_formats.events: "avro" is not allowed (allowed: protobuf, json, raw)`},
		{"malformed map", "", []string{"RATCHET_KAFKA_TOPIC_FORMATS=events"},
			`kafka.topic_formats (RATCHET_KAFKA_TOPIC_FORMATS): "events" is not allowed (allowed: comma-separated name=value pairs`},
		{"auto offset reset", "", []string{"RATCHET_KAFKA_AUTO_OFFSET_RESET=smallest"},
			`kafka.auto_offset_reset (RATCHET_KAFKA_AUTO_OFFSET_RESET): "smallest" is not allowed (allowed: earliest, latest)`},
		{"recycle too often", "kafka:\n  recycle_interval: 10ms\n", nil, `kafka.recycle_interval: "10ms" is not allowed (allowed: 0 (off) or 1s..720h)`},
		{"empty group", "kafka:\n  group_id: \"\"\n", nil, `kafka.group_id: "" is not allowed`},
		{"supervision window", "", []string{"RATCHET_SUPERVISION_WITHIN=0"}, `supervision.within (RATCHET_SUPERVISION_WITHIN): "0" is not allowed (allowed: 1s..24h)`},
		{"negative restarts", "supervision:\n  max_restarts: -1\n", nil, `supervision.max_restarts: "-1" is not allowed (allowed: >= 0)`},
		{"log level", "", []string{"RATCHET_LOG_LEVEL=loud"}, `log.level (RATCHET_LOG_LEVEL): "loud" is not allowed (allowed: debug, info, warn, error)`},
		{"log format", "log:\n  format: xml\n", nil, `log.format: "xml" is not allowed (allowed: json, text)`},
		{"dead-letter logging", "", []string{"RATCHET_LOG_DEAD_LETTERS=some"},
			`log.dead_letters (RATCHET_LOG_DEAD_LETTERS): "some" is not allowed (allowed: each, summary, off)`},
		{"dead-letter logging from file", "log:\n  dead_letters: all\n", nil, `log.dead_letters: "all" is not allowed (allowed: each, summary, off)`},
		{"dead-letter interval too short", "", []string{"RATCHET_LOG_DEAD_LETTER_INTERVAL=100ms"},
			`log.dead_letter_interval (RATCHET_LOG_DEAD_LETTER_INTERVAL): "100ms" is not allowed (allowed: 1s..24h)`},
		{"dead-letter interval not a duration", "log:\n  dead_letter_interval: soon\n", nil,
			`log.dead_letter_interval: "soon" is not allowed (allowed: a duration such as 250ms, 5s or 1m)`},
		{"managed property from file", "kafka:\n  properties: {enable.auto.commit: 'true'}\n", nil,
			`kafka.properties.enable.auto.commit: "true" is not allowed (allowed: not set here; ratchet manages it: it commits only what was applied)`},
		{"managed property from env", "", []string{"RATCHET_KAFKA_PROPERTIES=group.id=other"},
			`kafka.properties.group.id (RATCHET_KAFKA_PROPERTIES): "other" is not allowed (allowed: not set here; use kafka.group_id)`},
		{"bad property name", "kafka:\n  properties: {\"a b\": x}\n", nil, `kafka.properties: "a b" is not allowed (allowed: librdkafka property names`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := ""
			if tc.file != "" {
				path = writeFile(t, tc.file)
			}
			ce := problems(t, path, tc.env...)
			if len(ce.Problems) != 1 {
				t.Errorf("want exactly one problem, got %d:\n%v", len(ce.Problems), ce)
			}
			if !strings.Contains(ce.Error(), tc.want) {
				t.Errorf("error does not contain\n%s\ngot\n%s", tc.want, ce)
			}
		})
	}
}

func TestManagedPropertiesAllRefused(t *testing.T) {
	for name := range managedProperties {
		t.Run(name, func(t *testing.T) {
			c := Default()
			c.Kafka.Properties = Properties{name: "x"}
			err := c.Validate()
			if err == nil || !strings.HasPrefix(err.Error(), "kafka.properties."+name+": ") {
				t.Errorf("Validate with %s: %v", name, err)
			}
		})
	}
}

func TestEveryProblemAtOnce(t *testing.T) {
	path := writeFile(t, "kafka:\n  brokerz: [x:1]\ncommit:\n  mode: twice\nretry:\n  max_backoff: 1ms\n")
	ce := problems(t, path,
		"RATCHET_KAFKA_FORMAT=xml",
		"RATCHET_PROCESSING_BATCH_SIZE=0",
		"RATCHET_COMMIT_INTERVAL=soon",
		"RATCHET_LOG_LEVL=debug",
		"RATCHET_POSTGRES_URL=postgres://u:hunter2@db:notaport/x",
	)
	want := []string{
		"kafka.brokerz: unknown key (did you mean kafka.brokers?)",
		`commit.interval (RATCHET_COMMIT_INTERVAL): "soon" is not allowed (allowed: a duration such as 250ms, 5s or 1m)`,
		"RATCHET_LOG_LEVL: unknown variable (did you mean RATCHET_LOG_LEVEL?)",
		`kafka.format (RATCHET_KAFKA_FORMAT): "xml" is not allowed (allowed: protobuf, json, raw)`,
		`postgres.url (RATCHET_POSTGRES_URL): "REDACTED" is not allowed (allowed: a postgres:// or postgresql:// URL with a host, e.g. postgres://user@db:5432/ratchet)`,
		`processing.batch_size (RATCHET_PROCESSING_BATCH_SIZE): "0" is not allowed (allowed: 1..100000)`,
		`commit.mode: "twice" is not allowed (allowed: exactly-once, at-least-once)`,
		`retry.max_backoff: "1ms" is not allowed (allowed: >= retry.initial_backoff (100ms))`,
	}
	if got := ce.Error(); got != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", got, strings.Join(want, "\n"))
	}
	if len(ce.Problems) != len(want) {
		t.Errorf("%d problems, want %d", len(ce.Problems), len(want))
	}
}

func TestErrorIsJoinOfProblems(t *testing.T) {
	c := Default()
	c.Kafka.Format = "xml"
	c.Log.Level = "loud"
	err := c.Validate()
	if !IsConfigError(err) || !IsConfigError(fmt.Errorf("load: %w", err)) {
		t.Fatalf("IsConfigError(%v) = false", err)
	}
	if IsConfigError(errors.New("other")) || IsConfigError(nil) {
		t.Error("IsConfigError is true for other errors")
	}
	var p Problem
	if !errors.As(err, &p) || p.Key != "kafka.format" || p.Value != "xml" || p.Allowed != "protobuf, json, raw" {
		t.Errorf("errors.As(Problem) = %+v", p)
	}
	var ce *Error
	errors.As(err, &ce)
	if want := errors.Join(ce.Unwrap()...).Error(); err.Error() != want || strings.Count(want, "\n") != 1 {
		t.Errorf("Error() = %q, want errors.Join's %q", err, want)
	}
	if err := Default().Validate(); err != nil {
		t.Errorf("Default().Validate() = %v", err)
	}
}
