package config

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Problem is one bad configuration value.
type Problem struct {
	Key     string // section.key, or the environment variable of an unknown one
	Env     string // the environment variable the value came from, if any
	Value   string // the value as given, REDACTED when secret
	Allowed string // what is allowed
	Unknown bool   // the key itself does not exist
	FromEnv bool
}

func (p Problem) String() string {
	if p.Unknown {
		if p.FromEnv {
			return fmt.Sprintf("%s: unknown variable (no such key; see the configuration reference)", p.Key)
		}
		return fmt.Sprintf("%s: unknown key", p.Key)
	}
	name := p.Key
	if p.Env != "" {
		name = fmt.Sprintf("%s (%s)", p.Key, p.Env)
	}
	return fmt.Sprintf("%s: %q is not allowed (allowed: %s)", name, p.Value, p.Allowed)
}

// Error is a configuration that cannot be used. Its text has one line per
// problem. The command line exits with code 2 on it.
type Error struct {
	Problems []Problem
}

func (e *Error) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// Validate checks every value and reports all problems at once as a *Error.
func (c Config) Validate() error {
	var ps []Problem
	bad := func(key, value, allowed string) {
		ps = append(ps, Problem{Key: key, Value: value, Allowed: allowed})
	}
	oneOf := func(key, value string, allowed ...string) {
		for _, a := range allowed {
			if value == a {
				return
			}
		}
		bad(key, value, strings.Join(allowed, ", "))
	}
	durRange := func(key string, d, lo, hi time.Duration) {
		if d < lo || d > hi {
			bad(key, fmtDuration(d), fmt.Sprintf("%s..%s", fmtDuration(lo), fmtDuration(hi)))
		}
	}
	intMin := func(key string, v, lo int) {
		if v < lo {
			bad(key, strconv.Itoa(v), fmt.Sprintf(">= %d", lo))
		}
	}

	k := c.Kafka
	if len(k.Brokers) == 0 {
		bad("kafka.brokers", "", "one or more host:port")
	}
	for _, b := range k.Brokers {
		if _, port, err := net.SplitHostPort(b); err != nil || port == "" {
			bad("kafka.brokers", b, "host:port")
		}
	}
	if strings.TrimSpace(k.GroupID) == "" {
		bad("kafka.group_id", k.GroupID, "a non-empty group name")
	}
	if len(k.Topics) == 0 {
		bad("kafka.topics", "", "one or more topic names")
	}
	topics := map[string]bool{}
	for _, t := range k.Topics {
		if !validTopic(t) {
			bad("kafka.topics", t, "topic names of 1..249 characters from [a-zA-Z0-9._-]")
		}
		topics[t] = true
	}
	oneOf("kafka.format", k.Format, "protobuf", "json")
	for _, t := range sortedKeys(k.TopicFormats) {
		if !topics[t] {
			bad("kafka.topic_formats", t, "topics listed in kafka.topics")
		}
		oneOf("kafka.topic_formats."+t, k.TopicFormats[t], "protobuf", "json")
	}
	if k.DLQTopicName != "" {
		if !validTopic(k.DLQTopicName) {
			bad("kafka.dlq_topic", k.DLQTopicName, "a topic name of 1..249 characters from [a-zA-Z0-9._-]")
		} else if topics[k.DLQTopicName] {
			bad("kafka.dlq_topic", k.DLQTopicName, "a topic that is not an input topic")
		}
	}
	managed := map[string]string{
		"bootstrap.servers":             "set kafka.brokers",
		"group.id":                      "set kafka.group_id",
		"group.instance.id":             "set kafka.instance_id",
		"auto.offset.reset":             "set kafka.auto_offset_reset",
		"enable.auto.commit":            "ratchet commits only what was applied",
		"enable.auto.offset.store":      "ratchet commits only what was applied",
		"partition.assignment.strategy": "ratchet needs cooperative-sticky",
		"group.protocol":                "ratchet uses the classic protocol with cooperative-sticky",
		"go.logs.channel.enable":        "ratchet routes librdkafka logs itself",
		"enable.partition.eof":          "ratchet manages it",
	}
	for _, name := range sortedKeys(k.Properties) {
		if why, ok := managed[name]; ok {
			v := k.Properties[name]
			if SensitiveProperty(name) {
				v = "REDACTED"
			}
			bad("kafka.properties."+name, v, "not settable here: "+why)
		}
	}
	durRange("kafka.recycle_interval", k.RecycleInterval, 0, 30*24*time.Hour)
	if k.RecycleInterval > 0 && k.RecycleInterval < time.Second {
		bad("kafka.recycle_interval", fmtDuration(k.RecycleInterval), "0 (off) or at least 1s")
	}
	oneOf("kafka.auto_offset_reset", k.AutoOffsetReset, "earliest", "latest")

	raw := c.Postgres.URL.Reveal()
	if u, err := url.Parse(raw); err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" && u.Query().Get("host") == "" {
		bad("postgres.url", c.Postgres.URL.String(), "a postgres:// or postgresql:// URL with a host")
	}
	intMin("postgres.max_conns", c.Postgres.MaxConns, 0)

	p := c.Processing
	if p.BatchSize < 1 || p.BatchSize > 100000 {
		bad("processing.batch_size", strconv.Itoa(p.BatchSize), "1..100000")
	}
	durRange("processing.batch_linger", p.BatchLinger, 0, 10*time.Second)
	if p.MaxBufferedPerPartition < max(p.BatchSize, 1) {
		bad("processing.max_buffered_per_partition", strconv.Itoa(p.MaxBufferedPerPartition),
			fmt.Sprintf(">= processing.batch_size (%d)", p.BatchSize))
	}
	oneOf("commit.mode", c.Commit.Mode, ModeExactlyOnce, ModeAtLeastOnce)
	durRange("commit.interval", c.Commit.Interval, 10*time.Millisecond, time.Hour)

	r := c.Retry
	durRange("retry.initial_backoff", r.InitialBackoff, time.Millisecond, time.Hour)
	durRange("retry.max_backoff", r.MaxBackoff, time.Millisecond, 24*time.Hour)
	if r.MaxBackoff < r.InitialBackoff {
		bad("retry.max_backoff", fmtDuration(r.MaxBackoff), fmt.Sprintf(">= retry.initial_backoff (%s)", fmtDuration(r.InitialBackoff)))
	}
	if r.MaxAttempts < 1 || r.MaxAttempts > 1000 {
		bad("retry.max_attempts", strconv.Itoa(r.MaxAttempts), "1..1000")
	}
	intMin("supervision.max_restarts", c.Supervision.MaxRestarts, 0)
	durRange("supervision.within", c.Supervision.Within, time.Second, 24*time.Hour)

	if a := c.HTTP.Addr; a != "" {
		host, port, err := net.SplitHostPort(a)
		n, perr := strconv.Atoi(port)
		if err != nil || perr != nil || n < 0 || n > 65535 {
			bad("http.addr", a, "host:port (port 0: any free port), or empty to turn it off")
		} else if host == "" {
			bad("http.addr", a, "an explicit host, e.g. 127.0.0.1:8080 or 0.0.0.0:8080 to listen on every interface")
		}
	}
	if c.Shutdown.Timeout <= 0 || c.Shutdown.Timeout > time.Hour {
		bad("shutdown.timeout", fmtDuration(c.Shutdown.Timeout), "more than 0 and at most 1h")
	}
	oneOf("log.level", c.Log.Level, "debug", "info", "warn", "error")
	oneOf("log.format", c.Log.Format, "json", "text")
	if len(ps) == 0 {
		return nil
	}
	return &Error{Problems: ps}
}

func validTopic(t string) bool {
	if t == "" || len(t) > 249 || t == "." || t == ".." {
		return false
	}
	for _, r := range t {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}
