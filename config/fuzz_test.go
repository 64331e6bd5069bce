package config

import (
	"errors"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fuzzYAMLSeeds are configuration files, good and bad, besides the corpus
// in testdata/fuzz/FuzzLoadYAML.
var fuzzYAMLSeeds = []string{
	"kafka:\n  topics: [orders]\npipelines:\n  - name: orders\n    topic: orders\n    format: json\n    where: value.x\n    upsert: {table: t, key: {id: string(record.key)}, columns: {a: value.a}, on_tombstone: delete}\n  - name: r\n    topic: orders\n    format: json\n    rollup: {table: s.r, time: value.ts, bucket: 1m, bucket_column: m, group_by: {c: value.c}, aggregates: {n: count}}\n",
	"pipelines: [x, {name: 1}, {upsert: [1]}, {rollup: {bucket: x, group_by: 3}}]\n",
	"",
	"kafka:\n",
	"kafka:\n  brokers: [a:9092, b:9092]\n  topics: events\n",
	"kafka:\n  properties:\n    security.protocol: SASL_SSL\n    sasl.password: fuzz-secret-1\n",
	"postgres:\n  url: postgres://u:fuzz-secret-2@db:5432/x?sslmode=require\n",
	"postgres: {url: 'host=db password=fuzz-secret-3'}\n",
	"processing: {batch_size: -1}\n",
	"base: &b {batch_size: 5}\nprocessing: *b\n",
	"[1, 2]\n",
	"kafka: [a]\n",
	"kafka:\n  properties: [sasl.password, x]\n",
	"\t: :\n",
}

// checkLoaded holds Load to its contract: an error is a *Error with one
// line per problem; a configuration without error validates; and what a
// loaded configuration prints does not show its secrets.
func checkLoaded(t *testing.T, c Config, err error) {
	t.Helper()
	if err != nil {
		var ce *Error
		if !errors.As(err, &ce) || err != error(ce) {
			t.Fatalf("Load returned %T, want *config.Error: %v", err, err)
		}
		if len(ce.Problems) == 0 {
			t.Fatal("Load returned an *Error with no problems")
		}
		for _, p := range ce.Problems {
			if line := p.Error(); line == "" || strings.Contains(line, "\n") {
				t.Errorf("problem is not one line: %q", line)
			}
		}
		return
	}
	if verr := c.Validate(); verr != nil {
		t.Fatalf("Load succeeded but Validate fails: %v", verr)
	}
	printed := c.String() + "\n" + c.GoString()
	for k, v := range c.Kafka.Properties {
		if !SensitiveProperty(k) || len(v) < 6 {
			continue
		}
		// Without this one property, the value must not show anywhere: it
		// may be part of another name or value (a key of zeros and a
		// password of zeros), which is no leak.
		blank := c
		blank.Kafka.Properties = maps.Clone(c.Kafka.Properties)
		delete(blank.Kafka.Properties, k)
		if !strings.Contains(blank.String()+"\n"+blank.GoString(), v) && strings.Contains(printed, v) {
			t.Errorf("kafka.properties %s: its value shows in the printed configuration", k)
		}
	}
	if u, perr := url.Parse(c.Postgres.URL.Reveal()); perr == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok && len(pw) >= 6 {
			// The password may be part of the user, the host or the path
			// (a password "cret-4" and a host "0cret-40"), which is no
			// leak: only where the URL without it lacks it must the
			// printed URL lack it too.
			blank := c
			blank.Postgres.URL = ""
			bare := *u
			bare.User = url.User(u.User.Username())
			if !strings.Contains(blank.String(), pw) && !strings.Contains(bare.String(), pw) && strings.Contains(c.Postgres.URL.String(), pw) {
				t.Errorf("postgres.url: its password shows in %q", c.Postgres.URL.String())
			}
		}
	}
}

// FuzzLoadYAML loads arbitrary bytes as the configuration file.
func FuzzLoadYAML(f *testing.F) {
	for _, s := range fuzzYAMLSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "ratchet.yaml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(path, nil)
		checkLoaded(t, c, err)
	})
}

// FuzzLoadEnv loads arbitrary text as environment variables: one KEY=VALUE
// per line, each name prefixed with RATCHET_ unless it has it already.
func FuzzLoadEnv(f *testing.F) {
	for _, s := range []string{
		"",
		"KAFKA_BROKERS=a:9092,b:9092\nKAFKA_TOPICS=events",
		"POSTGRES_URL=postgres://u:fuzz-secret-4@db/x",
		"KAFKA_PROPERTIES=sasl.password=fuzz-secret-5,security.protocol=SASL_SSL",
		"KAFKA_PROPERTIES=sasl.password=a,b",
		"PROCESSING_BATCH_SIZE=x\nCOMMIT_INTERVAL=1h\nRETRY_MAX_BACKOFF=1ms",
		"KAFKA_BROKER=a:9092",
		"HTTP_ADDR=\nLOG_LEVEL=trace",
		"TEST_POSTGRES_URL=anything",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data string) {
		var environ []string
		for _, line := range strings.Split(data, "\n") {
			if !strings.HasPrefix(line, envPrefix) {
				line = envPrefix + line
			}
			environ = append(environ, line)
		}
		c, err := Load("", environ)
		checkLoaded(t, c, err)
	})
}
