package config

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// field binds one key to its place in a Config. The one table below drives
// the YAML and environment overlays, the redacted rendering and the
// reference documentation, so they cannot drift apart.
type field struct {
	key     string
	env     string
	meaning string
	secret  func(string) bool // reports whether a raw value must be redacted
	show    func() string     // current value, redacted
	set     func(string) error
	setNode func(*yaml.Node) error // nil: the scalar text goes through set
}

func (f *field) setString(s string) error { return f.set(s) }

func (f *field) setYAML(n *yaml.Node) error {
	if f.setNode != nil {
		return f.setNode(n)
	}
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("a single value")
	}
	return f.set(n.Value)
}

func (f *field) display() string { return f.show() }

// quote renders a raw value for a problem line, redacted when secret.
func (f *field) quote(raw string) string {
	if f.secret != nil && f.secret(raw) {
		return "REDACTED"
	}
	return raw
}

func envName(key string) string {
	return "RATCHET_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

func (c *Config) orderedFields() []*field {
	str := func(key string, p *string, meaning string) *field {
		return &field{key: key, meaning: meaning, show: func() string { return *p },
			set: func(s string) error { *p = strings.TrimSpace(s); return nil }}
	}
	dur := func(key string, p *time.Duration, meaning string) *field {
		return &field{key: key, meaning: meaning, show: func() string { return fmtDuration(*p) },
			set: func(s string) error {
				d, err := time.ParseDuration(strings.TrimSpace(s))
				if err != nil {
					return fmt.Errorf("a duration such as 250ms, 5s or 1m")
				}
				*p = d
				return nil
			}}
	}
	integer := func(key string, p *int, meaning string) *field {
		return &field{key: key, meaning: meaning, show: func() string { return strconv.Itoa(*p) },
			set: func(s string) error {
				v, err := strconv.Atoi(strings.TrimSpace(s))
				if err != nil {
					return fmt.Errorf("an integer")
				}
				*p = v
				return nil
			}}
	}
	list := func(key string, p *[]string, meaning string) *field {
		return &field{key: key, meaning: meaning, show: func() string { return strings.Join(*p, ",") },
			set: func(s string) error { *p = splitList(s); return nil },
			setNode: func(n *yaml.Node) error {
				switch n.Kind {
				case yaml.ScalarNode:
					*p = splitList(n.Value)
				case yaml.SequenceNode:
					var out []string
					for _, e := range n.Content {
						if e.Kind != yaml.ScalarNode {
							return fmt.Errorf("a list of strings")
						}
						if v := strings.TrimSpace(e.Value); v != "" {
							out = append(out, v)
						}
					}
					*p = out
				default:
					return fmt.Errorf("a list of strings")
				}
				return nil
			}}
	}
	mapping := func(key string, p *map[string]string, meaning string, secret func(k string) bool) *field {
		show := func() string {
			keys := make([]string, 0, len(*p))
			for k := range *p {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			parts := make([]string, 0, len(keys))
			for _, k := range keys {
				v := (*p)[k]
				if secret != nil && secret(k) {
					v = "REDACTED"
				}
				parts = append(parts, k+"="+v)
			}
			if len(parts) == 0 {
				return "{}"
			}
			return strings.Join(parts, ",")
		}
		f := &field{key: key, meaning: meaning, show: show,
			set: func(s string) error {
				m, err := parseMap(s)
				if err != nil {
					return err
				}
				*p = m
				return nil
			},
			setNode: func(n *yaml.Node) error {
				if n.Kind != yaml.MappingNode {
					return fmt.Errorf("a mapping of names to values")
				}
				m := make(map[string]string, len(n.Content)/2)
				for i := 0; i+1 < len(n.Content); i += 2 {
					k, v := n.Content[i], n.Content[i+1]
					if k.Kind != yaml.ScalarNode || v.Kind != yaml.ScalarNode {
						return fmt.Errorf("a mapping of names to values")
					}
					m[k.Value] = v.Value
				}
				*p = m
				return nil
			}}
		if secret != nil {
			// A map in one string (environment) is redacted whole when any
			// of its keys is sensitive.
			f.secret = func(raw string) bool {
				m, _ := parseMap(raw)
				for k := range m {
					if secret(k) {
						return true
					}
				}
				return strings.Contains(strings.ToLower(raw), "password") || strings.Contains(strings.ToLower(raw), "secret")
			}
		}
		return f
	}
	props := (*map[string]string)(&c.Kafka.Properties)
	fs := []*field{
		list("kafka.brokers", &c.Kafka.Brokers, "bootstrap servers, host:port"),
		str("kafka.group_id", &c.Kafka.GroupID, "consumer group"),
		list("kafka.topics", &c.Kafka.Topics, "input topics"),
		str("kafka.format", &c.Kafka.Format, "value format of the input: protobuf or json"),
		mapping("kafka.topic_formats", &c.Kafka.TopicFormats, "per-topic format override, topic=format", nil),
		str("kafka.dlq_topic", &c.Kafka.DLQTopicName, "dead-letter topic; empty means `<topic>.dlq`"),
		str("kafka.instance_id", &c.Kafka.InstanceID, "static membership (group.instance.id), e.g. the pod name"),
		mapping("kafka.properties", props, "extra librdkafka properties (TLS, SASL, ...)", SensitiveProperty),
		dur("kafka.recycle_interval", &c.Kafka.RecycleInterval, "rebuild the consumer this often, after a drain and flush; 0 is off"),
		str("kafka.auto_offset_reset", &c.Kafka.AutoOffsetReset, "start of a partition with no stored or committed offset: earliest or latest"),
		{key: "postgres.url", meaning: "a postgres:// or postgresql:// URL; its password is never printed",
			secret: func(string) bool { return true },
			show:   func() string { return c.Postgres.URL.String() },
			set:    func(s string) error { c.Postgres.URL = SecretURL(strings.TrimSpace(s)); return nil }},
		integer("postgres.max_conns", &c.Postgres.MaxConns, "pool size; 0 means assigned partitions + 4"),
		integer("processing.batch_size", &c.Processing.BatchSize, "max records per transaction"),
		dur("processing.batch_linger", &c.Processing.BatchLinger, "max wait to fill a batch"),
		integer("processing.max_buffered_per_partition", &c.Processing.MaxBufferedPerPartition, "pause the partition above this many buffered records"),
		str("commit.mode", &c.Commit.Mode, "exactly-once or at-least-once"),
		dur("commit.interval", &c.Commit.Interval, "Kafka commit cadence (coalesced)"),
		dur("retry.initial_backoff", &c.Retry.InitialBackoff, "first retry wait"),
		dur("retry.max_backoff", &c.Retry.MaxBackoff, "longest retry wait"),
		integer("retry.max_attempts", &c.Retry.MaxAttempts, "attempts for a record before the DLQ"),
		integer("supervision.max_restarts", &c.Supervision.MaxRestarts, "restarts of a partition actor allowed within supervision.within"),
		dur("supervision.within", &c.Supervision.Within, "window of the restart budget"),
		str("http.addr", &c.HTTP.Addr, "metrics, health and the page; port 0: any free port; empty: off"),
		dur("shutdown.timeout", &c.Shutdown.Timeout, "drain limit on stop"),
		str("log.level", &c.Log.Level, "debug, info, warn or error"),
		str("log.format", &c.Log.Format, "json or text"),
	}
	for _, f := range fs {
		f.env = envName(f.key)
	}
	return fs
}

func (c *Config) fields() map[string]*field {
	out := map[string]*field{}
	for _, f := range c.orderedFields() {
		out[f.key] = f
	}
	return out
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func parseMap(s string) (map[string]string, error) {
	m := map[string]string{}
	for _, p := range splitList(s) {
		k, v, ok := strings.Cut(p, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("comma-separated name=value pairs")
		}
		m[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return m, nil
}

func fmtDuration(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	s := d.String()
	// 1m0s → 1m, 1h0m0s → 1h: the way people write them.
	for _, suf := range []string{"m0s", "h0m"} {
		if strings.HasSuffix(s, suf) {
			s = strings.TrimSuffix(s, suf[1:])
		}
	}
	return s
}
