// Package config loads ratchet's configuration from a YAML file and
// RATCHET_* environment variables (the environment wins), fills in the
// defaults of DESIGN.md, and validates every value, reporting all problems
// at once, each on one line that names the key, the value and what is
// allowed. Secrets (the password of postgres.url, sensitive
// kafka.properties) never appear in what this package prints.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Commit modes.
const (
	ModeExactlyOnce = "exactly-once"
	ModeAtLeastOnce = "at-least-once"
)

// Config is the whole configuration.
type Config struct {
	Kafka       Kafka
	Postgres    Postgres
	Processing  Processing
	Commit      Commit
	Retry       Retry
	Supervision Supervision
	HTTP        HTTP
	Shutdown    Shutdown
	Log         Log
}

// Kafka is the kafka section.
type Kafka struct {
	Brokers         []string
	GroupID         string
	Topics          []string
	Format          string
	TopicFormats    map[string]string
	DLQTopicName    string // kafka.dlq_topic; empty means <topic>.dlq
	InstanceID      string
	Properties      Properties
	RecycleInterval time.Duration
	AutoOffsetReset string
}

// DLQTopic returns the dead-letter topic of topic.
func (k Kafka) DLQTopic(topic string) string {
	if k.DLQTopicName != "" {
		return k.DLQTopicName
	}
	return topic + ".dlq"
}

// Postgres is the postgres section.
type Postgres struct {
	URL      SecretURL
	MaxConns int
}

// Processing is the processing section.
type Processing struct {
	BatchSize               int
	BatchLinger             time.Duration
	MaxBufferedPerPartition int
}

// Commit is the commit section.
type Commit struct {
	Mode     string
	Interval time.Duration
}

// Retry is the retry section.
type Retry struct {
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	MaxAttempts    int
}

// Supervision is the supervision section: the restart budget of a
// partition actor.
type Supervision struct {
	MaxRestarts int
	Within      time.Duration
}

// HTTP is the http section.
type HTTP struct {
	Addr string
}

// Shutdown is the shutdown section.
type Shutdown struct {
	Timeout time.Duration
}

// Log is the log section.
type Log struct {
	Level  string
	Format string
}

// Default returns the configuration with every default of DESIGN.md.
func Default() Config {
	return Config{
		Kafka: Kafka{
			Brokers:         []string{"localhost:9092"},
			GroupID:         "ratchet",
			Topics:          []string{"events"},
			Format:          "protobuf",
			TopicFormats:    map[string]string{},
			Properties:      Properties{},
			AutoOffsetReset: "earliest",
		},
		Postgres:    Postgres{URL: "postgres://localhost:5432/ratchet"},
		Processing:  Processing{BatchSize: 500, BatchLinger: 20 * time.Millisecond, MaxBufferedPerPartition: 10000},
		Commit:      Commit{Mode: ModeExactlyOnce, Interval: time.Second},
		Retry:       Retry{InitialBackoff: 100 * time.Millisecond, MaxBackoff: 30 * time.Second, MaxAttempts: 5},
		Supervision: Supervision{MaxRestarts: 10, Within: time.Minute},
		HTTP:        HTTP{Addr: "127.0.0.1:8080"},
		Shutdown:    Shutdown{Timeout: 30 * time.Second},
		Log:         Log{Level: "info", Format: "json"},
	}
}

// FormatFor returns the value format of topic: its kafka.topic_formats
// entry, else kafka.format.
func (c Config) FormatFor(topic string) string {
	if f, ok := c.Kafka.TopicFormats[topic]; ok {
		return f
	}
	return c.Kafka.Format
}

// Load builds the configuration: defaults, then the YAML file at path (when
// path is not empty), then the RATCHET_* variables of environ (KEY=VALUE
// strings, as os.Environ returns them), then Validate. A returned error is a
// *Error listing every problem.
func Load(path string, environ []string) (Config, error) {
	cfg := Default()
	var problems []Problem
	if path != "" {
		raw, err := os.ReadFile(path)
		if err != nil {
			return cfg, &Error{Problems: []Problem{{Key: "--config", Value: path, Allowed: "a readable YAML file: " + err.Error()}}}
		}
		problems = append(problems, cfg.applyYAML(raw)...)
	}
	envProblems, fromEnv := cfg.applyEnv(environ)
	problems = append(problems, envProblems...)
	if len(problems) == 0 {
		if err := cfg.Validate(); err != nil {
			var ve *Error
			if errors.As(err, &ve) {
				for i, p := range ve.Problems {
					if env, ok := fromEnv[p.Key]; ok {
						ve.Problems[i].Env = env
					}
				}
			}
			return cfg, err
		}
		return cfg, nil
	}
	// Report parse problems together with validation problems of the keys
	// that did parse.
	if err := cfg.Validate(); err != nil {
		var ve *Error
		if errors.As(err, &ve) {
			seen := map[string]bool{}
			for _, p := range problems {
				seen[p.Key] = true
			}
			for _, p := range ve.Problems {
				if !seen[p.Key] {
					problems = append(problems, p)
				}
			}
		}
	}
	return cfg, &Error{Problems: problems}
}

func (c *Config) applyYAML(raw []byte) []Problem {
	var doc map[string]map[string]yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return []Problem{{Key: "--config", Value: "(file)", Allowed: "YAML with sections of keys: " + oneLine(err.Error())}}
	}
	fields := c.fields()
	var problems []Problem
	sections := make([]string, 0, len(doc))
	for s := range doc {
		sections = append(sections, s)
	}
	sort.Strings(sections)
	for _, s := range sections {
		keys := make([]string, 0, len(doc[s]))
		for k := range doc[s] {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			name := s + "." + k
			f, ok := fields[name]
			if !ok {
				problems = append(problems, Problem{Key: name, Unknown: true})
				continue
			}
			node := doc[s][k]
			if err := f.setYAML(&node); err != nil {
				problems = append(problems, Problem{Key: name, Value: f.quote(nodeText(&node)), Allowed: err.Error()})
			}
		}
	}
	return problems
}

// applyEnv overlays the RATCHET_* variables and returns the problems and,
// by key, the variables that set a value.
func (c *Config) applyEnv(environ []string) ([]Problem, map[string]string) {
	fromEnv := map[string]string{}
	fields := c.fields()
	byEnv := make(map[string]*field, len(fields))
	sections := map[string]bool{}
	for _, f := range fields {
		byEnv[f.env] = f
		sections[strings.ToUpper(strings.SplitN(f.key, ".", 2)[0])] = true
	}
	var problems []Problem
	names := make([]string, 0)
	values := map[string]string{}
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, "RATCHET_") {
			continue
		}
		names = append(names, name)
		values[name] = value
	}
	sort.Strings(names)
	for _, name := range names {
		f, ok := byEnv[name]
		if !ok {
			rest := strings.TrimPrefix(name, "RATCHET_")
			section, _, _ := strings.Cut(rest, "_")
			if sections[section] {
				problems = append(problems, Problem{Key: name, Unknown: true, FromEnv: true})
			}
			continue
		}
		fromEnv[f.key] = name
		if err := f.setString(values[name]); err != nil {
			problems = append(problems, Problem{Key: f.key, Env: name, Value: f.quote(values[name]), Allowed: err.Error()})
		}
	}
	return problems, fromEnv
}

// LogValue implements slog.LogValuer: the configuration with secrets
// redacted.
func (c Config) LogValue() slog.Value {
	attrs := []slog.Attr{}
	for _, f := range c.orderedFields() {
		attrs = append(attrs, slog.String(f.key, f.display()))
	}
	return slog.GroupValue(attrs...)
}

// String renders the configuration with secrets redacted.
func (c Config) String() string {
	var b strings.Builder
	for _, f := range c.orderedFields() {
		fmt.Fprintf(&b, "%s=%s\n", f.key, f.display())
	}
	return b.String()
}

// GoString keeps %#v from printing secrets.
func (c Config) GoString() string {
	return "config.Config{" + strings.ReplaceAll(strings.TrimSpace(c.String()), "\n", ", ") + "}"
}

// Format keeps every fmt verb (%v, %+v, %s, ...) on the redacted form.
func (c Config) Format(s fmt.State, verb rune) { _, _ = fmt.Fprint(s, c.String()) }

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// nodeText is a YAML value as text, for problem lines.
func nodeText(n *yaml.Node) string {
	if n.Kind == yaml.ScalarNode {
		return n.Value
	}
	out, err := yaml.Marshal(n)
	if err != nil {
		return "(value)"
	}
	return oneLine(string(out))
}
