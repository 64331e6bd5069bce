package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const planted = "pl4nted-S3cret"

// secretConfig loads a configuration with the planted secret in the
// database URL and in every kind of sensitive librdkafka property.
func secretConfig(tb testing.TB) Config {
	tb.Helper()
	path := writeFile(tb, `
kafka:
  properties:
    security.protocol: SASL_SSL
    sasl.mechanism: SCRAM-SHA-512
    sasl.username: app
    sasl.password: `+planted+`
    ssl.key.password: `+planted+`
    ssl.key.pem: "-----BEGIN PRIVATE KEY-----`+planted+`"
    sasl.oauthbearer.client.secret: `+planted+`
`)
	return mustLoad(tb, path, "RATCHET_POSTGRES_URL=postgres://app:"+planted+"@db:5432/ratchet?sslmode=require",
		"RATCHET_SCHEMA_REGISTRY_URL=https://key:"+planted+"@registry:8081", "RATCHET_SCHEMA_REGISTRY_USERNAME=u-"+planted,
		"RATCHET_SCHEMA_REGISTRY_PASSWORD="+planted)
}

func TestSecretsNeverPrinted(t *testing.T) {
	cfg := secretConfig(t)
	var jsonLog, textLog bytes.Buffer
	slog.New(slog.NewJSONHandler(&jsonLog, nil)).Info("config", "config", cfg, "url", cfg.Postgres.URL, "props", cfg.Kafka.Properties)
	slog.New(slog.NewTextHandler(&textLog, nil)).Info("config", "config", cfg)
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ym, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	outputs := map[string]string{
		"%v":                 fmt.Sprintf("%v", cfg),
		"%+v":                fmt.Sprintf("%+v", cfg),
		"%#v":                fmt.Sprintf("%#v", cfg),
		"%s":                 fmt.Sprintf("%s", cfg),
		"String":             cfg.String(),
		"%+v Postgres":       fmt.Sprintf("%+v", cfg.Postgres),
		"%#v Postgres":       fmt.Sprintf("%#v", cfg.Postgres),
		"%+v Kafka":          fmt.Sprintf("%+v", cfg.Kafka),
		"%#v Kafka":          fmt.Sprintf("%#v", cfg.Kafka),
		"%v url":             fmt.Sprintf("%v", cfg.Postgres.URL),
		"%q url":             fmt.Sprintf("%q", cfg.Postgres.URL),
		"%v properties":      fmt.Sprint(cfg.Kafka.Properties),
		"slog json":          jsonLog.String(),
		"slog text":          textLog.String(),
		"json":               string(js),
		"yaml":               string(ym),
		"Redacted %+v":       fmt.Sprintf("%+v", cfg.Redacted()),
		"Redacted url":       cfg.Redacted().Postgres.URL.Reveal(),
		"Redacted property":  cfg.Redacted().Kafka.Properties["sasl.password"],
		"%+v SchemaRegistry": fmt.Sprintf("%+v", cfg.SchemaRegistry),
		"%#v SchemaRegistry": fmt.Sprintf("%#v", cfg.SchemaRegistry),
		"%v registry secret": fmt.Sprintf("%v", cfg.SchemaRegistry.Password),
		"Redacted registry":  cfg.Redacted().SchemaRegistry.Password.Reveal() + cfg.Redacted().SchemaRegistry.URL.Reveal(),
		"Reference markdown": ReferenceMarkdown(),
	}
	for name, out := range outputs {
		if strings.Contains(out, planted) {
			t.Errorf("%s reveals the secret: %s", name, out)
		}
		if name != "Reference markdown" && !strings.Contains(out, "REDACTED") {
			t.Errorf("%s shows no REDACTED marker: %s", name, out)
		}
	}
	if !strings.Contains(cfg.Postgres.URL.Reveal(), planted) || cfg.Kafka.Properties["sasl.password"] != planted ||
		cfg.SchemaRegistry.Password.Reveal() != planted || cfg.SchemaRegistry.Username.Reveal() != "u-"+planted {
		t.Error("the configuration itself must keep the secrets")
	}
	if !strings.Contains(textLog.String(), "config.kafka.properties.sasl.username=app") {
		t.Errorf("slog output lost the non-secret properties: %s", textLog.String())
	}
}

// TestTokenURLNeverPrinted: a registry URL whose user information is a
// token alone (https://TOKEN@host) prints the token nowhere.
func TestTokenURLNeverPrinted(t *testing.T) {
	cfg := mustLoad(t, writeFile(t, "kafka:\n  group_id: g\n"), "RATCHET_SCHEMA_REGISTRY_URL=https://"+planted+"@registry:8081")
	var jsonLog, textLog bytes.Buffer
	slog.New(slog.NewJSONHandler(&jsonLog, nil)).Info("config", "config", cfg, "url", cfg.SchemaRegistry.URL)
	slog.New(slog.NewTextHandler(&textLog, nil)).Info("config", "config", cfg)
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ym, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string]string{
		"%v":             fmt.Sprintf("%v", cfg),
		"%#v":            fmt.Sprintf("%#v", cfg),
		"%+v registry":   fmt.Sprintf("%+v", cfg.SchemaRegistry),
		"%#v url":        fmt.Sprintf("%#v", cfg.SchemaRegistry.URL),
		"slog json":      jsonLog.String(),
		"slog text":      textLog.String(),
		"json":           string(js),
		"yaml":           string(ym),
		"Redacted url":   cfg.Redacted().SchemaRegistry.URL.Reveal(),
		"in an error":    RedactURL(`Get "` + cfg.SchemaRegistry.URL.Reveal() + `/schemas/ids/1": EOF`),
		"in an error, q": RedactURL(fmt.Sprintf("dial %q: refused", cfg.SchemaRegistry.URL.Reveal())),
	} {
		if strings.Contains(out, planted) {
			t.Errorf("%s reveals the token: %s", name, out)
		}
		if !strings.Contains(out, "REDACTED@registry:8081") {
			t.Errorf("%s shows no REDACTED@registry:8081: %s", name, out)
		}
	}
	if cfg.SchemaRegistry.URL.Reveal() != "https://"+planted+"@registry:8081" {
		t.Error("the configuration itself must keep the token")
	}
}

func TestSecretsNeverInProblems(t *testing.T) {
	cases := []struct {
		name string
		file string
		env  []string
	}{
		{"bad scheme with password", "", []string{"RATCHET_POSTGRES_URL=mysql://u:" + planted + "@db/x"}},
		{"unparsable url with password", "", []string{"RATCHET_POSTGRES_URL=postgres://u:" + planted + "@db:port/x"}},
		{"no scheme separator", "", []string{"RATCHET_POSTGRES_URL=postgres//u:" + planted + "@db/x"}},
		{"key=value dsn", "", []string{"RATCHET_POSTGRES_URL=host=db password=" + planted}},
		{"url in file", "postgres:\n  url: mysql://u:" + planted + "@db/x\n", nil},
		{"url list in file", "postgres:\n  url: [\"postgres://u:" + planted + "@db/x\"]\n", nil},
		{"malformed properties from env", "", []string{"RATCHET_KAFKA_PROPERTIES=sasl.password=" + planted + ",oops"}},
		{"password with a comma", "", []string{"RATCHET_KAFKA_PROPERTIES=sasl.password=ab," + planted}},
		{"properties not a mapping", "kafka:\n  properties: [\"sasl.password=" + planted + "\"]\n", nil},
		{"property value not scalar", "kafka:\n  properties: {sasl.password: [" + planted + "]}\n", nil},
		{"registry url with password", "", []string{"RATCHET_SCHEMA_REGISTRY_URL=ftp://u:" + planted + "@registry/x"}},
		{"registry url with a token", "", []string{"RATCHET_SCHEMA_REGISTRY_URL=ftp://" + planted + "@registry/x"}},
		{"registry url with a token, bad port", "", []string{"RATCHET_SCHEMA_REGISTRY_URL=https://" + planted + "@registry:0"}},
		{"registry password without url", "", []string{"RATCHET_SCHEMA_REGISTRY_PASSWORD=" + planted}},
		{"registry password not scalar", "schema_registry:\n  password: [" + planted + "]\n", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := ""
			if tc.file != "" {
				path = writeFile(t, tc.file)
			}
			ce := problems(t, path, tc.env...)
			if strings.Contains(ce.Error(), planted) {
				t.Errorf("problem reveals the secret: %s", ce)
			}
			if !strings.Contains(ce.Error(), "REDACTED") {
				t.Errorf("problem shows no REDACTED marker: %s", ce)
			}
		})
	}
}

func TestRedactURL(t *testing.T) {
	cases := []struct{ in, want string }{
		{"postgres://app:pw@db:5432/x", "postgres://app:REDACTED@db:5432/x"},
		{"postgres://app@db/x", "postgres://app@db/x"},
		{"postgres://db/x", "postgres://db/x"},
		{"postgres://app:p%40ss@db/x", "postgres://app:REDACTED@db/x"},
		{"postgres://app:p@ss@db/x", "postgres://app:REDACTED@db/x"},
		{"postgres://db/x?sslmode=require&password=pw", "postgres://db/x?password=REDACTED&sslmode=require"},
		{"dial postgres://app:pw@db/x: refused", "dial postgres://app:REDACTED@db/x: refused"},
		{"connect postgres://app:p/w@db:1/x failed", "connect postgres://app:REDACTED@db:1/x failed"},
		{"host=db user=app password=pw sslmode=disable", "host=db user=app password=REDACTED sslmode=disable"},
		{"host=db password='p w' dbname=x", "host=db password=REDACTED dbname=x"},
		{"no secrets here", "no secrets here"},
		{"https://t0ken@registry:8081", "https://REDACTED@registry:8081"},
		{"https://t0ken@registry:8081/sr?x=1", "https://REDACTED@registry:8081/sr?x=1"},
		{"http://key:pw@registry", "http://key:REDACTED@registry"},
		{"https://registry:8081", "https://registry:8081"},
		{"HTTPS://t0ken@registry", "https://REDACTED@registry"},
		{"POSTGRESQL://app@db/x", "POSTGRESQL://app@db/x"},
		{`Get "https://t0ken@registry:8081/schemas/ids/1": dial tcp: refused`,
			`Get "https://REDACTED@registry:8081/schemas/ids/1": dial tcp: refused`},
		{"registry https://t0ken@a:1 and https://k:pw@b:2 and postgres://app@db/x",
			"registry https://REDACTED@a:1 and https://k:REDACTED@b:2 and postgres://app@db/x"},
		{"mail admin@example.com", "mail admin@example.com"},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			if got := RedactURL(tc.in); got != tc.want {
				t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestSensitiveProperty(t *testing.T) {
	cases := []struct {
		name string
		want bool
	}{
		{"sasl.password", true},
		{"ssl.key.password", true},
		{"ssl.key.pem", true},
		{"ssl.key.location", true},
		{"ssl.keystore.password", true},
		{"sasl.oauthbearer.client.secret", true},
		{"sasl.oauthbearer.config", true},
		{"sasl.jaas.config", true},
		{"some.api.token", true},
		{"schema.registry.apikey", true},
		{"SASL.PASSWORD", true},
		{"security.protocol", false},
		{"sasl.mechanism", false},
		{"sasl.username", false},
		{"ssl.ca.location", false},
		{"ssl.certificate.pem", false},
		{"ssl.keystore.location", false},
		{"sasl.kerberos.keytab", false},
		{"sasl.oauthbearer.client.id", false},
		{"socket.keepalive.enable", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := SensitiveProperty(tc.name); got != tc.want {
				t.Errorf("SensitiveProperty(%q) = %v, want %v", tc.name, got, tc.want)
			}
		})
	}
}

func TestRedactedSharesNothing(t *testing.T) {
	cfg := secretConfig(t)
	r := cfg.Redacted()
	r.Kafka.Brokers[0] = "changed:1"
	r.Kafka.Properties["security.protocol"] = "PLAINTEXT"
	if cfg.Kafka.Brokers[0] == "changed:1" || cfg.Kafka.Properties["security.protocol"] != "SASL_SSL" {
		t.Error("Redacted shares slices or maps with the original")
	}
	if got := r.Postgres.URL.Reveal(); got != "postgres://app:REDACTED@db:5432/ratchet?sslmode=require" {
		t.Errorf("redacted url %q", got)
	}
}

// The startup line says how the topics of pipelines are decoded: their
// format, not kafka.format, which it marks unused when pipelines read
// every topic; each pipeline is named with its topic, format and table.
func TestLogValueWithPipelines(t *testing.T) {
	cfg := Default()
	cfg.Kafka.Topics = []string{"app_events", "other"}
	cfg.Pipelines = []Pipeline{{Name: "orders", Topic: "app_events", Format: PipelineJSON, Upsert: &Upsert{Table: "orders"}},
		{Name: "order_log", Topic: "app_events", Format: PipelineJSON, Append: &Append{Table: "order_log"}}}
	line := func(c Config) map[string]any {
		var b bytes.Buffer
		slog.New(slog.NewJSONHandler(&b, nil)).Info("ratchet starting", "config", c)
		var m map[string]any
		if err := json.Unmarshal(b.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		return m["config"].(map[string]any)
	}
	c := line(cfg)
	kafka := c["kafka"].(map[string]any)
	if kafka["format"] != "protobuf" || kafka["topic_formats"].(map[string]any)["app_events"] != "json (pipelines)" {
		t.Errorf("kafka: %v; want format protobuf (for other) and app_events json (pipelines)", kafka)
	}
	if pl := c["pipelines"].(map[string]any); pl["orders"] != "app_events json upsert into orders" || pl["order_log"] != "app_events json append into order_log" {
		t.Errorf("pipelines: %v", c["pipelines"])
	}
	cfg.Kafka.Topics = []string{"app_events"}
	if f := line(cfg)["kafka"].(map[string]any)["format"]; f != "unused: pipelines decode every topic (kafka.topic_formats)" {
		t.Errorf("kafka.format %v, want it marked unused", f)
	}
	if len(cfg.Kafka.TopicFormats) != 0 {
		t.Errorf("logging changed the configuration: %v", cfg.Kafka.TopicFormats)
	}
}
