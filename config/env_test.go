package config

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestEnvironmentListsAndMaps(t *testing.T) {
	cases := []struct {
		name string
		env  string
		get  func(Config) any
		want any
	}{
		{"list", "RATCHET_KAFKA_BROKERS=a:1,b:2", func(c Config) any { return c.Kafka.Brokers }, []string{"a:1", "b:2"}},
		{"list with spaces and empty items", "RATCHET_KAFKA_TOPICS= a , ,b,", func(c Config) any { return c.Kafka.Topics }, []string{"a", "b"}},
		{"one item", "RATCHET_KAFKA_TOPICS=orders", func(c Config) any { return c.Kafka.Topics }, []string{"orders"}},
		{"map", "RATCHET_KAFKA_PROPERTIES=security.protocol=SSL, ssl.ca.location=/ca.pem", func(c Config) any { return c.Kafka.Properties },
			Properties{"security.protocol": "SSL", "ssl.ca.location": "/ca.pem"}},
		{"map value with =", "RATCHET_KAFKA_PROPERTIES=sasl.oauthbearer.extensions=a=b", func(c Config) any { return c.Kafka.Properties },
			Properties{"sasl.oauthbearer.extensions": "a=b"}},
		{"empty map", "RATCHET_KAFKA_PROPERTIES=", func(c Config) any { return c.Kafka.Properties }, Properties{}},
		{"topic formats", "RATCHET_KAFKA_TOPIC_FORMATS=events=json", func(c Config) any { return c.Kafka.TopicFormats }, map[string]string{"events": "json"}},
		{"duration", "RATCHET_KAFKA_RECYCLE_INTERVAL=90m", func(c Config) any { return c.Kafka.RecycleInterval }, 90 * time.Minute},
		{"int", "RATCHET_POSTGRES_MAX_CONNS= 16 ", func(c Config) any { return c.Postgres.MaxConns }, 16},
		{"string trimmed", "RATCHET_KAFKA_INSTANCE_ID= pod-3 ", func(c Config) any { return c.Kafka.InstanceID }, "pod-3"},
		{"secret url", "RATCHET_POSTGRES_URL=postgres://u:p@db/x", func(c Config) any { return c.Postgres.URL.Reveal() }, "postgres://u:p@db/x"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := mustLoad(t, "", tc.env)
			if got := tc.get(cfg); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("%s gives %#v, want %#v", tc.env, got, tc.want)
			}
		})
	}
}

func TestEnvironmentLastWins(t *testing.T) {
	cfg := mustLoad(t, "", "RATCHET_LOG_LEVEL=debug", "RATCHET_LOG_LEVEL=warn")
	if cfg.Log.Level != "warn" {
		t.Errorf("log.level %q, want the last value warn", cfg.Log.Level)
	}
}

func TestEnvironmentStrict(t *testing.T) {
	t.Run("unknown variables of our sections", func(t *testing.T) {
		ce := problems(t, "", "RATCHET_KAFKA_BROKER=x:1", "RATCHET_COMMIT_INTERVALL=1s", "RATCHET_LOG_FROBNICATE=1")
		want := []string{
			"RATCHET_COMMIT_INTERVALL: unknown variable (did you mean RATCHET_COMMIT_INTERVAL?)",
			"RATCHET_KAFKA_BROKER: unknown variable (did you mean RATCHET_KAFKA_BROKERS?)",
			"RATCHET_LOG_FROBNICATE: unknown variable",
		}
		if got := ce.Error(); got != strings.Join(want, "\n") {
			t.Errorf("got\n%s\nwant\n%s", got, strings.Join(want, "\n"))
		}
	})
	t.Run("pipelines are file only", func(t *testing.T) {
		ce := problems(t, "", "RATCHET_PIPELINES=[{name: a}]", "RATCHET_PIPELINES_0_NAME=a")
		want := []string{
			"RATCHET_PIPELINES: pipelines are read from the configuration file only (pipelines: in the YAML file)",
			"RATCHET_PIPELINES_0_NAME: pipelines are read from the configuration file only (pipelines: in the YAML file)",
		}
		if got := ce.Error(); got != strings.Join(want, "\n") {
			t.Errorf("got\n%s\nwant\n%s", got, strings.Join(want, "\n"))
		}
	})
	t.Run("other variables ignored", func(t *testing.T) {
		mustLoad(t, "",
			"RATCHET_TEST_POSTGRES_URL=postgres://elsewhere/x",
			"RATCHET_ARTIFACTS_DIR=/tmp",
			"RATCHET_=x",
			"RATCHET",
			"KAFKA_BROKERS=nonsense",
			"ratchet_kafka_brokers=nonsense",
			"PATH=/bin")
	})
}

func TestNearest(t *testing.T) {
	cases := []struct{ name, want string }{
		{"kafka.brokerz", "kafka.brokers"},
		{"KAFKA.BROKER", "kafka.brokers"},
		{"commit.intreval", "commit.interval"},
		{"kafka.zzzzzz", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := nearest(tc.name, keyNames()); got != tc.want {
				t.Errorf("nearest(%q) = %q, want %q", tc.name, got, tc.want)
			}
		})
	}
}
