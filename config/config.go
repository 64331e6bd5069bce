// Package config loads ratchet's configuration: the defaults of DESIGN.md,
// overlaid by a YAML file, overlaid by RATCHET_* environment variables (the
// environment wins). Load and Validate report every problem at once as an
// *Error, one line per problem naming the key, the value and what is
// allowed; the command line exits with code 2 on it.
//
// Secrets never appear in what this package prints: the passwords of
// postgres.url and schema_registry.url (SecretURLs), schema_registry.password
// (a Secret) and sensitive kafka.properties values (see SensitiveProperty)
// render as REDACTED in String, fmt verbs, slog and problem lines. Only
// Reveal returns the real values.
package config

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"ratchet/internal/event"
)

// Commit modes (commit.mode).
const (
	ModeExactlyOnce = "exactly-once"
	ModeAtLeastOnce = "at-least-once"
)

// Config is the whole configuration. Build it with Default or Load; a value
// built by hand should pass Validate before use.
type Config struct {
	Kafka          Kafka
	Postgres       Postgres
	Processing     Processing
	Commit         Commit
	Retry          Retry
	Supervision    Supervision
	HTTP           HTTP
	Shutdown       Shutdown
	Startup        Startup
	Log            Log
	SchemaRegistry SchemaRegistry
	Tracing        Tracing
	// Pipelines (pipelines, file only) are processors declared in
	// configuration; when there are any, ratchet run applies them instead
	// of the built-in dashboard.
	Pipelines []Pipeline
}

// Kafka is the kafka section: where to read and how.
type Kafka struct {
	Brokers      []string          // kafka.brokers, host:port
	GroupID      string            // kafka.group_id
	Topics       []string          // kafka.topics
	Format       string            // kafka.format: event.FormatProtobuf, event.FormatJSON or event.FormatRaw
	TopicFormats map[string]string // kafka.topic_formats, per-topic Format override
	DLQTopicName string            // kafka.dlq_topic; empty means <topic>.dlq (see DLQTopic)
	InstanceID   string            // kafka.instance_id, group.instance.id when set
	Properties   Properties        // kafka.properties, extra librdkafka properties
	// RecycleInterval (kafka.recycle_interval) rebuilds the consumer this
	// often, after a drain and flush; 0 is off.
	RecycleInterval time.Duration
	// AutoOffsetReset (kafka.auto_offset_reset), earliest or latest, applies
	// only to partitions with no stored or committed offset.
	AutoOffsetReset string
}

// DLQTopic returns the dead-letter topic of the input topic: kafka.dlq_topic
// when set, otherwise topic + ".dlq".
func (k Kafka) DLQTopic(topic string) string {
	if k.DLQTopicName != "" {
		return k.DLQTopicName
	}
	return topic + ".dlq"
}

// Postgres is the postgres section.
type Postgres struct {
	URL SecretURL // postgres.url; prints redacted, Reveal to connect
	// MaxConns (postgres.max_conns) is the pool size; 0 means the number of
	// partitions of the input topics + 4, chosen at start from their metadata.
	MaxConns int
	// SynchronousCommit (postgres.synchronous_commit) is on or off. Off
	// lets exactly-once batch transactions commit without waiting for
	// their WAL flush (PostgreSQL's synchronous_commit, set per
	// transaction): the rows every partition updates are unlocked sooner.
	// A PostgreSQL crash can then lose the last transactions, results and
	// offsets together, and ratchet applies them again from Kafka.
	SynchronousCommit string
}

// Processing is the processing section: batching and back-pressure.
type Processing struct {
	BatchSize   int           // processing.batch_size, records per transaction
	BatchLinger time.Duration // processing.batch_linger, max wait to fill a batch
	// MaxBatchSize (processing.max_batch_size) is the most records a
	// transaction takes when its partition is behind; 0 means
	// DefaultBatchGrowth × BatchSize (MaxBatch).
	MaxBatchSize int
	// MaxBufferedPerPartition (processing.max_buffered_per_partition) is
	// the most records one partition holds, however much of MemoryBudget
	// is free: it bounds what a slow or stuck partition keeps.
	MaxBufferedPerPartition int
	// MemoryBudget (processing.memory_budget) bounds the bytes of records
	// all partitions of the instance hold together, whatever their number
	// (see actors.Budget for what counts and how it is shared).
	MemoryBudget ByteSize
}

// DefaultBatchGrowth is how many times processing.batch_size a partition
// that is behind puts in one transaction when processing.max_batch_size is
// not set.
const DefaultBatchGrowth = 4

// maxBatchLimit bounds processing.batch_size and processing.max_batch_size.
const maxBatchLimit = 100000

// MaxBatch returns the most records one transaction takes: a partition
// whose queue holds more than BatchSize records (it is behind) cuts
// batches of up to this many, one transaction, one COMMIT and one offset
// advance for all of them; at lower rates a batch is BatchSize records or
// what BatchLinger gathered.
func (p Processing) MaxBatch() int {
	if p.MaxBatchSize > 0 {
		return max(p.MaxBatchSize, p.BatchSize)
	}
	return min(max(DefaultBatchGrowth*p.BatchSize, p.BatchSize), maxBatchLimit)
}

// ByteSize is a number of bytes, written as an integer or with a binary
// unit: 512KiB, 64MiB, 1GiB.
type ByteSize int64

// byteUnits are the suffixes ParseByteSize takes, longest first.
var byteUnits = []struct {
	suffix string
	n      int64
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

// ParseByteSize parses "64MiB", "512KiB", "1GiB", "100B" or a plain
// integer of bytes.
func ParseByteSize(s string) (ByteSize, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range byteUnits {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = strings.TrimSpace(rest), u.n
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("a size such as 64MiB, 512KiB, 1GiB or a number of bytes")
	}
	return ByteSize(n * mult), nil
}

// String renders b with the largest binary unit that divides it.
func (b ByteSize) String() string {
	for _, u := range byteUnits {
		if b != 0 && int64(b)%u.n == 0 {
			return strconv.FormatInt(int64(b)/u.n, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(b), 10) + "B"
}

// Commit is the commit section.
type Commit struct {
	Mode     string        // commit.mode, ModeExactlyOnce or ModeAtLeastOnce
	Interval time.Duration // commit.interval, Kafka commit cadence
}

// Retry is the retry section: record-level retries with exponential backoff.
type Retry struct {
	InitialBackoff time.Duration // retry.initial_backoff
	MaxBackoff     time.Duration // retry.max_backoff, at least InitialBackoff
	MaxAttempts    int           // retry.max_attempts, before a record goes to the DLQ
}

// Supervision is the supervision section: the restart budget of a
// partition actor. More than MaxRestarts restarts within Within stop it.
type Supervision struct {
	MaxRestarts int           // supervision.max_restarts
	Within      time.Duration // supervision.within
}

// HTTP is the http section.
type HTTP struct {
	// Addr (http.addr) is host:port for metrics, health and the page; port
	// 0 picks any free port; empty turns the server off.
	Addr string
}

// Shutdown is the shutdown section.
type Shutdown struct {
	Timeout time.Duration // shutdown.timeout, drain limit on stop
}

// Startup is the startup section.
type Startup struct {
	// Timeout (startup.timeout) is how long a start retries an unreachable
	// PostgreSQL or Kafka before it gives up with exit 1; 0 waits forever.
	Timeout time.Duration
}

// SchemaRegistry is the schema_registry section. When URL is set, protobuf
// and json values are expected in the Confluent Schema Registry wire format
// (magic byte, schema id, for protobuf the message indexes), and each
// schema id is looked up in the registry.
type SchemaRegistry struct {
	// URL (schema_registry.url) is the registry's http:// or https:// URL;
	// empty turns framing off. Credentials in it print redacted.
	URL SecretURL
	// Username and Password (schema_registry.username, .password) are the
	// basic-auth credentials, e.g. a Confluent Cloud API key and secret.
	// Both are secrets: an API key names an account.
	Username Secret
	Password Secret
}

// Tracing is the tracing section. Where spans go, how many are sampled
// and the service's name come from the standard OTEL_* variables
// (internal/tracing/otlp); this section only switches tracing on.
type Tracing struct {
	// Enabled (tracing.enabled) exports OpenTelemetry traces; off, nothing
	// is recorded or exported.
	Enabled bool
}

// Log is the log section.
type Log struct {
	Level  string // log.level: debug, info, warn or error
	Format string // log.format: json or text
	// DeadLetters (log.dead_letters) is how dead letters are logged:
	// DeadLettersEach (a line per record), DeadLettersSummary (the first of
	// a topic and reason in full, then a count per DeadLetterInterval) or
	// DeadLettersOff. The DLQ record and the metrics keep every detail
	// whatever it says.
	DeadLetters string
	// DeadLetterInterval (log.dead_letter_interval) is the shortest time
	// between two summary lines of one topic and reason.
	DeadLetterInterval time.Duration
	// IncludeValues (log.include_values) lets the reasons of dead letters
	// reach the log lines, the span attributes and the page as they are.
	// Off (the default), the values of records they quote are replaced by
	// "…" there (package redact); the dead letter's ratchet.error header
	// keeps the full text either way.
	IncludeValues bool
}

// Dead-letter logging modes (log.dead_letters).
const (
	DeadLettersEach    = "each"
	DeadLettersSummary = "summary"
	DeadLettersOff     = "off"
)

// Default returns the configuration with every default of DESIGN.md. Each
// call returns fresh maps and slices.
func Default() Config {
	return Config{
		Kafka: Kafka{
			Brokers:         []string{"localhost:9092"},
			GroupID:         "ratchet",
			Topics:          []string{"events"},
			Format:          event.FormatProtobuf,
			TopicFormats:    map[string]string{},
			Properties:      Properties{},
			AutoOffsetReset: "earliest",
		},
		Postgres: Postgres{URL: "postgres://localhost:5432/ratchet", SynchronousCommit: "on"},
		Processing: Processing{
			BatchSize:               500,
			BatchLinger:             20 * time.Millisecond,
			MaxBufferedPerPartition: 10000,
			MemoryBudget:            32 << 20,
		},
		Commit:      Commit{Mode: ModeExactlyOnce, Interval: time.Second},
		Retry:       Retry{InitialBackoff: 100 * time.Millisecond, MaxBackoff: 30 * time.Second, MaxAttempts: 5},
		Supervision: Supervision{MaxRestarts: 10, Within: time.Minute},
		HTTP:        HTTP{Addr: "127.0.0.1:8080"},
		Shutdown:    Shutdown{Timeout: 30 * time.Second},
		Startup:     Startup{Timeout: 5 * time.Minute},
		Log: Log{Level: "info", Format: "json", DeadLetters: DeadLettersSummary,
			DeadLetterInterval: 30 * time.Second},
	}
}

// FormatFor returns the value format of topic: its kafka.topic_formats
// entry, otherwise kafka.format.
func (c Config) FormatFor(topic string) string {
	if f, ok := c.Kafka.TopicFormats[topic]; ok {
		return f
	}
	return c.Kafka.Format
}

// Load builds the configuration: Default, then the YAML file at path (when
// path is not empty), then the RATCHET_* variables of environ (KEY=VALUE
// strings as os.Environ returns them; Load reads no environment of its
// own), then Validate.
//
// The file is strict: a key that does not exist is a problem. So is a
// RATCHET_<SECTION>_* variable whose section is one of ours but whose key
// is not; other RATCHET_* variables (RATCHET_TEST_POSTGRES_URL) are left
// alone. Values that do not parse and values that do not validate are
// collected together and returned as one *Error; a problem with a value
// from the environment names the variable too. When the error is not nil
// the returned Config must not be used.
func Load(path string, environ []string) (Config, error) {
	c := Default()
	var ps []Problem
	if path != "" {
		ps = append(ps, c.loadFile(path)...)
	}
	envProblems, fromEnv := c.applyEnv(environ)
	ps = append(ps, envProblems...)

	// A key that did not parse keeps an older value; validating that value
	// would only add noise.
	failed := map[string]bool{}
	for _, p := range ps {
		failed[p.Key] = true
	}
	var invalid *Error
	if errors.As(c.Validate(), &invalid) {
		for _, p := range invalid.Problems {
			if failed[p.Key] {
				continue
			}
			p.Env = envOf(p.Key, fromEnv)
			ps = append(ps, p)
		}
	}
	if len(ps) > 0 {
		return c, &Error{Problems: ps}
	}
	return c, nil
}

// yamlSyntax splits a yaml syntax error: "yaml: line N: problem".
var yamlSyntax = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// yamlError is err, raw's syntax error, on one line, naming the line of
// the problem. The yaml package names the line above the block the
// problem is in (a mis-indented key deep in the tenth pipeline is
// reported where the pipelines list starts): the problem's line is the
// first from there whose prefix of raw fails the same way.
func yamlError(raw []byte, err error) string {
	msg := oneLine(err.Error())
	m := yamlSyntax.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	from, _ := strconv.Atoi(m[1])
	lines := strings.SplitAfter(string(raw), "\n")
	var prefix strings.Builder
	for i, l := range lines {
		prefix.WriteString(l)
		if i+1 <= from {
			continue
		}
		var doc yaml.Node
		perr := yaml.Unmarshal([]byte(prefix.String()), &doc)
		if perr == nil {
			continue
		}
		if pm := yamlSyntax.FindStringSubmatch(oneLine(perr.Error())); pm != nil && pm[2] == m[2] {
			if i+1 == from {
				break
			}
			return fmt.Sprintf("line %d: %s (in the block from line %d)", i+1, m[2], from+1)
		}
	}
	return strings.TrimPrefix(msg, "yaml: ")
}

// loadFile overlays the YAML file at path.
func (c *Config) loadFile(path string) []Problem {
	raw, err := os.ReadFile(path)
	if err != nil {
		return []Problem{{Key: path, Reason: "cannot read the configuration file: " + oneLine(unwrapPathError(err))}}
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		// yaml syntax errors name a line and a token class, never a value.
		return []Problem{{Key: path, Reason: "not valid YAML: " + yamlError(raw, err)}}
	}
	if len(doc.Content) == 0 {
		return nil // empty file
	}
	top := resolve(doc.Content[0])
	if top.Kind != yaml.MappingNode {
		return []Problem{{Key: path, Reason: "not a YAML mapping of sections (kafka:, postgres:, ...)"}}
	}
	var ps []Problem
	for i := 0; i+1 < len(top.Content); i += 2 {
		section, body := top.Content[i].Value, resolve(top.Content[i+1])
		if section == "pipelines" {
			ps = append(ps, c.loadPipelines(body)...)
			continue
		}
		if !slices.Contains(sections(), section) {
			reason := "unknown key"
			if _, ok := lookup(section); ok {
				s, k, _ := strings.Cut(section, ".")
				reason += fmt.Sprintf(" (write it nested: %s: {%s: ...})", s, k)
			} else if near := nearest(section, sections()); near != "" {
				reason += " (did you mean " + near + "?)"
			}
			ps = append(ps, Problem{Key: section, Reason: reason})
			continue
		}
		if isNull(body) {
			continue // "kafka:" with nothing under it
		}
		if body.Kind != yaml.MappingNode {
			ps = append(ps, Problem{Key: section, Value: nodeText(body), Allowed: "a mapping of " + section + ".* keys"})
			continue
		}
		for j := 0; j+1 < len(body.Content); j += 2 {
			name := section + "." + body.Content[j].Value
			k, ok := lookup(name)
			if !ok {
				reason := "unknown key"
				if near := nearest(name, keyNames()); near != "" {
					reason += " (did you mean " + near + "?)"
				}
				ps = append(ps, Problem{Key: name, Reason: reason})
				continue
			}
			node := resolve(body.Content[j+1])
			if err := setNode(k.field(c), node); err != nil {
				ps = append(ps, Problem{Key: name, Value: quoteNode(k.field(c), node), Allowed: err.Error()})
			}
		}
	}
	return ps
}

// setText parses s into the field p points to.
func setText(p any, s string) error {
	s = strings.TrimSpace(s)
	switch p := p.(type) {
	case *string:
		*p = s
	case *SecretURL:
		*p = SecretURL(s)
	case *Secret:
		*p = Secret(s)
	case *bool:
		switch strings.ToLower(s) {
		case "true":
			*p = true
		case "false":
			*p = false
		default:
			return fmt.Errorf("true or false")
		}
	case *int:
		v, err := strconv.Atoi(s)
		if err != nil {
			return fmt.Errorf("an integer")
		}
		*p = v
	case *ByteSize:
		b, err := ParseByteSize(s)
		if err != nil {
			return err
		}
		*p = b
	case *time.Duration:
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("a duration such as 250ms, 5s or 1m")
		}
		*p = d
	case *[]string:
		*p = splitList(s)
	case *map[string]string:
		m, err := parseMap(s)
		if err != nil {
			return err
		}
		*p = m
	case *Properties:
		m, err := parseMap(s)
		if err != nil {
			return err
		}
		*p = m
	default:
		panic(fmt.Sprintf("config: no parser for %T", p))
	}
	return nil
}

// setNode parses a YAML value into the field p points to: lists take a
// sequence (or one comma-separated string), maps take a mapping, every
// other field takes a scalar.
func setNode(p any, n *yaml.Node) error {
	switch p := p.(type) {
	case *[]string:
		switch {
		case isNull(n):
			*p = nil
		case n.Kind == yaml.ScalarNode:
			*p = splitList(n.Value)
		case n.Kind == yaml.SequenceNode:
			var out []string
			for _, e := range n.Content {
				e = resolve(e)
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
	case *map[string]string, *Properties:
		m := map[string]string{}
		if !isNull(n) {
			if n.Kind != yaml.MappingNode {
				return fmt.Errorf("a mapping of names to values")
			}
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := resolve(n.Content[i]), resolve(n.Content[i+1])
				if k.Kind != yaml.ScalarNode || v.Kind != yaml.ScalarNode {
					return fmt.Errorf("a mapping of names to single values")
				}
				m[strings.TrimSpace(k.Value)] = strings.TrimSpace(v.Value)
			}
		}
		if q, ok := p.(*Properties); ok {
			*q = m
		} else {
			*p.(*map[string]string) = m
		}
		return nil
	}
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("a single value")
	}
	if isNull(n) {
		return setText(p, "")
	}
	return setText(p, n.Value)
}

// show renders the field p points to, redacted, the way it is written in
// a file or variable.
func show(p any) string {
	switch p := p.(type) {
	case *string:
		return *p
	case *SecretURL:
		return p.String()
	case *Secret:
		return p.String()
	case *bool:
		return strconv.FormatBool(*p)
	case *int:
		return strconv.Itoa(*p)
	case *ByteSize:
		return p.String()
	case *time.Duration:
		return fmtDuration(*p)
	case *[]string:
		return strings.Join(*p, ",")
	case *map[string]string:
		return showMap(*p, nil)
	case *Properties:
		return showMap(*p, SensitiveProperty)
	default:
		panic(fmt.Sprintf("config: no printer for %T", p))
	}
}

// showMap renders m as name=value pairs in name order, "{}" when empty,
// with the values of secret names redacted.
func showMap(m map[string]string, secret func(string) bool) string {
	if len(m) == 0 {
		return "{}"
	}
	parts := make([]string, 0, len(m))
	for _, k := range sortedKeys(m) {
		v := m[k]
		if secret != nil && secret(k) {
			v = redacted
		}
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}

// quoteNode renders a YAML value that did not parse into the field p
// points to, for a problem line, without secrets.
func quoteNode(p any, n *yaml.Node) string {
	switch p.(type) {
	case *SecretURL:
		if n.Kind != yaml.ScalarNode {
			return redacted
		}
		return SecretURL(n.Value).String()
	case *Secret:
		return redacted
	case *Properties:
		if n.Kind == yaml.MappingNode {
			for i := 0; i < len(n.Content); i += 2 {
				if SensitiveProperty(n.Content[i].Value) {
					return redacted
				}
			}
		}
		return quoteProperties(nodeText(n))
	}
	return nodeText(n)
}

// resolve follows YAML aliases (*name) to the node they stand for.
func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// nodeText is a YAML value as one line of text, for problem lines.
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

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// unwrapPathError drops the path from an *os.PathError message; the
// problem line names the file already.
func unwrapPathError(err error) string {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err.Error()
	}
	return err.Error()
}

// sections returns the section names, in reference order.
func sections() []string {
	var out []string
	for _, k := range keys {
		if s := k.section(); !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

func keyNames() []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.name
	}
	return out
}

// fmtDuration writes d the way people write it: 1m, not 1m0s; 0, not 0s.
func fmtDuration(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
