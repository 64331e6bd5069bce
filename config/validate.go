package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"ratchet/internal/event"
)

// Problem is one thing wrong with a configuration. Its Error is one line:
//
//	kafka.format: "xml" is not allowed (allowed: protobuf, json)
//	processing.batch_size (RATCHET_PROCESSING_BATCH_SIZE): "-1" is not allowed (allowed: 1..100000)
//	kafka.brokerz: unknown key (did you mean kafka.brokers?)
//	RATCHET_KAFKA_BROKER: unknown variable (did you mean RATCHET_KAFKA_BROKERS?)
type Problem struct {
	// Key is the key (kafka.format, kafka.properties.group.id), or the file
	// for a problem with the file as a whole. Empty for an unknown variable.
	Key string
	// Env is the environment variable the value came from, if any.
	Env string
	// Value is the value as given, REDACTED (or with its password
	// redacted) when it is a secret.
	Value string
	// Allowed says what is allowed instead of Value.
	Allowed string
	// Reason replaces Value and Allowed when the key itself is the
	// problem: "unknown key", "unknown variable", an unreadable file.
	Reason string
}

// Error returns the problem as one line: the key (and variable), then the
// quoted value, then what is allowed.
func (p Problem) Error() string {
	name := safeName(p.Key)
	switch {
	case p.Key == "":
		name = safeName(p.Env)
	case p.Env != "":
		name = safeName(p.Key) + " (" + safeName(p.Env) + ")"
	}
	if p.Reason != "" {
		return name + ": " + p.Reason
	}
	return fmt.Sprintf("%s: %q is not allowed (allowed: %s)", name, p.Value, p.Allowed)
}

// safeName quotes a key or variable name that holds anything but the
// characters real names use, so that an unknown name with a newline or
// control characters in it cannot break the one-line-per-problem output.
func safeName(s string) string {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' || r == '/' || r == '[' || r == ']') {
			return strconv.Quote(s)
		}
	}
	return s
}

// Error is a configuration that cannot be used, with every problem found.
// Load and Validate return it (always as *Error); the command line prints
// one line per problem and exits with code 2. It behaves like the
// errors.Join of its problems: Error joins their lines with "\n" and
// Unwrap returns them, so errors.As finds a Problem too.
type Error struct {
	Problems []Problem
}

// Error returns one line per problem.
func (e *Error) Error() string {
	return errors.Join(e.Unwrap()...).Error()
}

// Unwrap returns the problems as errors.
func (e *Error) Unwrap() []error {
	errs := make([]error, len(e.Problems))
	for i, p := range e.Problems {
		errs[i] = p
	}
	return errs
}

// IsConfigError reports whether err is, or wraps, a configuration *Error:
// a problem the operator must fix, as opposed to a failure at run time.
func IsConfigError(err error) bool {
	var e *Error
	return errors.As(err, &e)
}

// managedProperties are librdkafka properties ratchet sets itself because
// its guarantees depend on them (or because a key of its own sets them);
// kafka.properties may not override them. The value says what to do
// instead.
var managedProperties = map[string]string{
	"bootstrap.servers":               "use kafka.brokers",
	"group.id":                        "use kafka.group_id",
	"group.instance.id":               "use kafka.instance_id",
	"auto.offset.reset":               "use kafka.auto_offset_reset",
	"enable.auto.commit":              "ratchet manages it: it commits only what was applied",
	"enable.auto.offset.store":        "ratchet manages it: it commits only what was applied",
	"partition.assignment.strategy":   "ratchet manages it: cooperative-sticky keeps partitions from rewinding on a rebalance",
	"group.protocol":                  "ratchet manages it: the classic protocol with cooperative-sticky",
	"enable.partition.eof":            "ratchet manages it",
	"go.logs.channel.enable":          "ratchet manages it: librdkafka logs go to the ratchet log",
	"go.events.channel.enable":        "ratchet manages it: the consumer is polled",
	"go.application.rebalance.enable": "ratchet manages it: rebalances go through its callback",
	"enable.idempotence":              "ratchet manages it: dead letters need an idempotent producer",
	"acks":                            "ratchet manages it: dead letters need acks=all",
	"transactional.id":                "ratchet manages it: the dead-letter producer is not transactional",
}

// The range of processing.memory_budget. Below 1 MiB a batch of ordinary
// records would not fit; the upper bound only catches a unit mistake.
const (
	minMemoryBudget ByteSize = 1 << 20
	maxMemoryBudget ByteSize = 64 << 30
)

// Validate checks every value and returns a *Error with all problems at
// once, or nil.
func (c Config) Validate() error {
	v := &validator{}
	c.validateKafka(v)
	c.validatePostgres(v)
	c.validateSchemaRegistry(v)
	c.validatePipelines(v)

	p := c.Processing
	v.intRange("processing.batch_size", p.BatchSize, 1, maxBatchLimit)
	if p.MaxBatchSize != 0 && (p.MaxBatchSize < p.BatchSize || p.MaxBatchSize > maxBatchLimit) {
		v.bad("processing.max_batch_size", strconv.Itoa(p.MaxBatchSize),
			fmt.Sprintf("0 (%d × processing.batch_size), or processing.batch_size (%d)..%d", DefaultBatchGrowth, p.BatchSize, maxBatchLimit))
	}
	v.durRange("processing.batch_linger", p.BatchLinger, 0, 10*time.Second)
	if p.MaxBufferedPerPartition < max(p.BatchSize, 1) {
		v.bad("processing.max_buffered_per_partition", strconv.Itoa(p.MaxBufferedPerPartition),
			fmt.Sprintf(">= processing.batch_size (%d)", p.BatchSize))
	}
	if p.MemoryBudget < minMemoryBudget || p.MemoryBudget > maxMemoryBudget {
		v.bad("processing.memory_budget", p.MemoryBudget.String(),
			fmt.Sprintf("%s..%s", ByteSize(minMemoryBudget), ByteSize(maxMemoryBudget)))
	}

	v.oneOf("commit.mode", c.Commit.Mode, ModeExactlyOnce, ModeAtLeastOnce)
	v.oneOf("postgres.synchronous_commit", c.Postgres.SynchronousCommit, "on", "off")
	if c.Postgres.SynchronousCommit == "off" && c.Commit.Mode == ModeAtLeastOnce {
		// Kafka's committed offset would pass results a crash undid.
		v.bad("postgres.synchronous_commit", "off", "on with commit.mode at-least-once (only exactly-once keeps the offsets with the results)")
	}
	v.durRange("commit.interval", c.Commit.Interval, 10*time.Millisecond, time.Hour)

	r := c.Retry
	v.durRange("retry.initial_backoff", r.InitialBackoff, time.Millisecond, time.Hour)
	if r.MaxBackoff < r.InitialBackoff {
		v.bad("retry.max_backoff", fmtDuration(r.MaxBackoff), fmt.Sprintf(">= retry.initial_backoff (%s)", fmtDuration(r.InitialBackoff)))
	} else {
		v.durRange("retry.max_backoff", r.MaxBackoff, time.Millisecond, 24*time.Hour)
	}
	v.intMin("retry.max_attempts", r.MaxAttempts, 1)

	v.intMin("supervision.max_restarts", c.Supervision.MaxRestarts, 0)
	v.durRange("supervision.within", c.Supervision.Within, time.Second, 24*time.Hour)

	if a := c.HTTP.Addr; a != "" {
		host, port, err := net.SplitHostPort(a)
		n, perr := strconv.Atoi(port)
		switch {
		case err != nil || perr != nil || n < 0 || n > 65535:
			v.bad("http.addr", a, "host:port with a port of 0..65535 (0: any free port), or empty to turn the server off")
		case host == "":
			v.bad("http.addr", a, "an explicit host: 127.0.0.1:8080, or 0.0.0.0:8080 to listen on every interface")
		}
	}
	if d := c.Shutdown.Timeout; d <= 0 || d > time.Hour {
		v.bad("shutdown.timeout", fmtDuration(d), "more than 0, at most 1h")
	}
	if d := c.Startup.Timeout; d < 0 || (d > 0 && d < time.Second) || d > 24*time.Hour {
		v.bad("startup.timeout", fmtDuration(d), "0 (wait forever), or 1s to 24h")
	}
	v.oneOf("log.level", c.Log.Level, "debug", "info", "warn", "error")
	v.oneOf("log.format", c.Log.Format, "json", "text")
	v.oneOf("log.dead_letters", c.Log.DeadLetters, DeadLettersEach, DeadLettersSummary, DeadLettersOff)
	v.durRange("log.dead_letter_interval", c.Log.DeadLetterInterval, time.Second, 24*time.Hour)
	return v.err()
}

func (c Config) validateKafka(v *validator) {
	k := c.Kafka
	if len(k.Brokers) == 0 {
		v.bad("kafka.brokers", "", "one or more host:port")
	}
	for _, b := range k.Brokers {
		host, port, err := net.SplitHostPort(b)
		n, perr := strconv.Atoi(port)
		if err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
			v.bad("kafka.brokers", b, "host:port with a port of 1..65535")
		}
	}
	if strings.TrimSpace(k.GroupID) == "" {
		v.bad("kafka.group_id", k.GroupID, "a non-empty group name")
	}

	if len(k.Topics) == 0 {
		v.bad("kafka.topics", "", "one or more topic names")
	}
	seen := map[string]bool{}
	for _, t := range k.Topics {
		switch {
		case !validTopic(t):
			v.bad("kafka.topics", t, "topic names of 1..249 characters from [a-zA-Z0-9._-]")
		case seen[t]:
			v.bad("kafka.topics", t, "each topic once")
		}
		seen[t] = true
	}
	for _, t := range k.Topics {
		switch dlq := k.DLQTopic(t); {
		case k.DLQTopicName != "":
			// Checked once below.
		case seen[dlq]:
			v.bad("kafka.topics", dlq, fmt.Sprintf("input topics other than the dead-letter topic of %s (or set kafka.dlq_topic)", t))
		case validTopic(t) && !validTopic(dlq):
			v.bad("kafka.topics", t, "names of at most 245 characters, so that <topic>.dlq is a valid topic (or set kafka.dlq_topic)")
		}
	}

	v.oneOf("kafka.format", k.Format, event.FormatProtobuf, event.FormatJSON, event.FormatRaw)
	for _, t := range sortedKeys(k.TopicFormats) {
		if !seen[t] {
			v.bad("kafka.topic_formats", t, "topics listed in kafka.topics ("+strings.Join(k.Topics, ", ")+")")
		}
		v.oneOf("kafka.topic_formats."+t, k.TopicFormats[t], event.FormatProtobuf, event.FormatJSON, event.FormatRaw)
	}
	if d := k.DLQTopicName; d != "" {
		switch {
		case !validTopic(d):
			v.bad("kafka.dlq_topic", d, "a topic name of 1..249 characters from [a-zA-Z0-9._-], or empty for <topic>.dlq")
		case seen[d]:
			v.bad("kafka.dlq_topic", d, "a topic that is not an input topic")
		}
	}

	for _, name := range sortedKeys(k.Properties) {
		value := k.Properties[name]
		if SensitiveProperty(name) {
			value = redacted
		}
		if !validPropertyName(name) {
			v.bad("kafka.properties", name, "librdkafka property names such as security.protocol")
			continue
		}
		if why, ok := managedProperties[name]; ok {
			v.bad("kafka.properties."+name, value, "not set here; "+why)
		}
	}

	if d := k.RecycleInterval; d != 0 && (d < time.Second || d > 30*24*time.Hour) {
		v.bad("kafka.recycle_interval", fmtDuration(d), "0 (off) or 1s..720h")
	}
	v.oneOf("kafka.auto_offset_reset", k.AutoOffsetReset, "earliest", "latest")
}

// sslModes are the sslmode values libpq and pgx accept.
var sslModes = []string{"disable", "allow", "prefer", "require", "verify-ca", "verify-full"}

func (c Config) validatePostgres(v *validator) {
	const allowed = "a postgres:// or postgresql:// URL with a host, e.g. postgres://user@db:5432/ratchet"
	raw := c.Postgres.URL.Reveal()
	u, err := url.Parse(raw)
	switch {
	case err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Opaque != "":
		v.bad("postgres.url", c.Postgres.URL.String(), allowed)
	case u.Host == "" && u.Query().Get("host") == "":
		v.bad("postgres.url", c.Postgres.URL.String(), allowed)
	case u.Port() != "" && !validPort(u.Port()):
		v.bad("postgres.url", c.Postgres.URL.String(), "a port of 1..65535")
	default:
		if m := u.Query().Get("sslmode"); m != "" && !slices.Contains(sslModes, m) {
			v.bad("postgres.url", c.Postgres.URL.String(), "sslmode one of "+strings.Join(sslModes, ", "))
		}
	}
	v.intMin("postgres.max_conns", c.Postgres.MaxConns, 0)
}

func (c Config) validateSchemaRegistry(v *validator) {
	r := c.SchemaRegistry
	if r.URL == "" {
		if r.Username != "" {
			v.bad("schema_registry.username", r.Username.String(), "empty unless schema_registry.url is set")
		}
		if r.Password != "" {
			v.bad("schema_registry.password", r.Password.String(), "empty unless schema_registry.url is set")
		}
		return
	}
	const allowed = "an http:// or https:// URL with a host, e.g. http://registry:8081, or empty"
	u, err := url.Parse(r.URL.Reveal())
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Opaque != "" || u.Host == "":
		v.bad("schema_registry.url", r.URL.String(), allowed)
	case u.Port() != "" && !validPort(u.Port()):
		v.bad("schema_registry.url", r.URL.String(), "a port of 1..65535")
	}
	if r.Password != "" && r.Username == "" {
		v.bad("schema_registry.username", "", "the user the password belongs to (set with schema_registry.password)")
	}
}

// validator collects problems.
type validator struct{ ps []Problem }

func (v *validator) bad(key, value, allowed string) {
	v.ps = append(v.ps, Problem{Key: key, Value: value, Allowed: allowed})
}

func (v *validator) oneOf(key, value string, allowed ...string) {
	if !slices.Contains(allowed, value) {
		v.bad(key, value, strings.Join(allowed, ", "))
	}
}

func (v *validator) intRange(key string, n, lo, hi int) {
	if n < lo || n > hi {
		v.bad(key, strconv.Itoa(n), fmt.Sprintf("%d..%d", lo, hi))
	}
}

func (v *validator) intMin(key string, n, lo int) {
	if n < lo {
		v.bad(key, strconv.Itoa(n), fmt.Sprintf(">= %d", lo))
	}
}

func (v *validator) durRange(key string, d, lo, hi time.Duration) {
	if d < lo || d > hi {
		v.bad(key, fmtDuration(d), fmtDuration(lo)+".."+fmtDuration(hi))
	}
}

func (v *validator) err() error {
	if len(v.ps) == 0 {
		return nil
	}
	return &Error{Problems: v.ps}
}

func validPort(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n >= 1 && n <= 65535
}

// validTopic reports whether t is a legal Kafka topic name.
func validTopic(t string) bool {
	if t == "" || len(t) > 249 || t == "." || t == ".." {
		return false
	}
	for _, r := range t {
		if !isNameChar(r) {
			return false
		}
	}
	return true
}

// validPropertyName reports whether name looks like a librdkafka property.
func validPropertyName(name string) bool {
	if name == "" {
		return false
	}
	for _, r := range name {
		if !isNameChar(r) {
			return false
		}
	}
	return true
}

func isNameChar(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
}
