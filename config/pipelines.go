package config

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"ratchet/internal/event"
)

// Pipeline formats (pipelines[].format).
const (
	PipelineJSON     = "json"     // any JSON document (JSON Schema wire format with a registry)
	PipelineAvro     = "avro"     // Schema Registry wire format, the writer's Avro schema
	PipelineProtobuf = "protobuf" // Schema Registry wire format, the writer's message type
	PipelineEvent    = "event"    // ratchet.v1.Event as the topic's kafka.format says
)

// Tombstone handling of an upsert pipeline (pipelines[].upsert.on_tombstone).
const (
	TombstoneIgnore = "ignore"
	TombstoneDelete = "delete"
)

// Pipeline is one entry of the pipelines list: a processor declared in
// configuration that writes what it reads from Topic into a table: keeping
// the latest row per key (Upsert), aggregating per group and time bucket
// (Rollup), or inserting one row per record (Append). Expressions are CEL; package processor/pipeline
// compiles them.
type Pipeline struct {
	Name   string
	Topic  string
	Format string
	Where  string // empty: every record
	Upsert *Upsert
	Rollup *Rollup
	Append *Append
	// EpochMillisWindow (epoch_millis_window) bounds a time given as epoch
	// milliseconds around the record's Kafka timestamp; zero fields take
	// the defaults (see Window).
	EpochMillisWindow TimeWindow
	// CostLimit (cost_limit) bounds the CEL cost of each evaluation of one
	// of the pipeline's expressions; 0 takes DefaultCostLimit.
	CostLimit uint64
	// Errors is when the pipeline's failure guard stops its topic
	// instead of dead-lettering more of it (pipelines[].errors); zero
	// fields take the defaults (Limits).
	Errors PipelineErrors
}

// TimeWindow is how far before and after a reference time a time may be.
type TimeWindow struct {
	Past, Future time.Duration
}

// Defaults of a pipeline's epoch_millis_window and cost_limit. Twenty years
// back lets backfills of old history in, while epoch seconds read as
// milliseconds (January 1970, whatever the year) stay out; a day ahead
// allows for producers' clocks, while microseconds and nanoseconds read as
// milliseconds (tens of thousands of years ahead, or more) stay out.
const (
	DefaultEpochMillisPast   = 7305 * 24 * time.Hour // 20 years
	DefaultEpochMillisFuture = 24 * time.Hour
	// DefaultCostLimit bounds one expression on one record to 0.1-0.5 s
	// of one core (by the machine's load) and some 20 MB: the issue's
	// quadratic comprehension on a 6 KB record, stopped there. Ordinary
	// expressions cost under a hundred, a comprehension some six to
	// fourteen per element.
	DefaultCostLimit = 1_000_000
)

// Window returns p's epoch_millis_window, defaults filled in.
func (p Pipeline) Window() TimeWindow {
	w := p.EpochMillisWindow
	if w.Past == 0 {
		w.Past = DefaultEpochMillisPast
	}
	if w.Future == 0 {
		w.Future = DefaultEpochMillisFuture
	}
	return w
}

// Cost returns p's cost_limit, the default filled in.
func (p Pipeline) Cost() uint64 {
	if p.CostLimit == 0 {
		return DefaultCostLimit
	}
	return p.CostLimit
}

// PipelineErrors is the failure guard of one pipeline: when, among the
// last Window records of its topic, at least MinFailures failed for the
// pipeline and more than MaxRatio of them did, its topic's partitions are
// held (nothing applied, nothing dead-lettered) until the configuration is
// fixed and ratchet restarted. MaxRatio 1 never trips. Zero fields mean
// the defaults.
type PipelineErrors struct {
	MaxRatio    float64
	MinFailures int
	Window      int
}

// The failure guard's defaults: a pipeline on which every record fails
// stops after 100 dead letters; a poison rate up to half of the records
// (over a window of 1000) never stops it.
const (
	DefaultPipelineMaxRatio    = 0.5
	DefaultPipelineMinFailures = 100
	DefaultPipelineWindow      = 1000
)

// Limits returns e with the defaults in place of zero fields.
func (e PipelineErrors) Limits() PipelineErrors {
	if e.MaxRatio == 0 {
		e.MaxRatio = DefaultPipelineMaxRatio
	}
	if e.MinFailures == 0 {
		e.MinFailures = DefaultPipelineMinFailures
	}
	if e.Window == 0 {
		e.Window = DefaultPipelineWindow
	}
	return e
}

// Column is a column name and the CEL expression that yields its value.
// Lists of them keep the order of the file.
type Column struct {
	Name string
	Expr string
}

// Upsert is a pipeline sink that keeps one row per key.
type Upsert struct {
	Table       string
	Key         []Column
	Columns     []Column
	OnTombstone string // TombstoneIgnore (default) or TombstoneDelete
	// Version, when set, is a CEL expression yielding a timestamp or a
	// number: a row is replaced only by a record whose version is not
	// older than the row's. VersionColumn is the column that stores it
	// (see docs/pipelines.md for the default).
	Version       string
	VersionColumn string
}

// Rollup is a pipeline sink that aggregates records per group and time
// bucket. Each aggregate is "count" or sum(E), min(E), max(E).
type Rollup struct {
	Table        string
	Time         string
	Bucket       time.Duration
	BucketColumn string
	GroupBy      []Column
	Aggregates   []Column
}

// Append is a pipeline sink that inserts one row per record (an event
// log, an audit trail): no key, tombstones ignored.
type Append struct {
	Table   string
	Columns []Column
}

// PipelineKey returns the key path of the i-th pipeline, e.g. pipelines[1],
// followed by the parts given: PipelineKey(1, "rollup", "aggregates",
// "revenue") is pipelines[1].rollup.aggregates.revenue.
func PipelineKey(i int, parts ...string) string {
	return strings.Join(append([]string{fmt.Sprintf("pipelines[%d]", i)}, parts...), ".")
}

// loadPipelines reads the pipelines list of the file. Unknown keys and
// values of the wrong shape are problems naming their path.
func (c *Config) loadPipelines(n *yaml.Node) []Problem {
	c.Pipelines = nil
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		return []Problem{{Key: "pipelines", Value: nodeText(n), Allowed: "a list of pipelines ({name, topic, format, upsert | rollup | append})"}}
	}
	var ps []Problem
	for i, e := range n.Content {
		p, eps := loadPipeline(i, resolve(e))
		ps = append(ps, eps...)
		c.Pipelines = append(c.Pipelines, p)
	}
	return ps
}

func loadPipeline(i int, n *yaml.Node) (Pipeline, []Problem) {
	var p Pipeline
	key := PipelineKey(i)
	if n.Kind != yaml.MappingNode {
		return p, []Problem{{Key: key, Value: nodeText(n), Allowed: "a mapping with name, topic, format and upsert, rollup or append"}}
	}
	var ps []Problem
	scalar := func(k string, v *yaml.Node, dst *string) {
		if v.Kind != yaml.ScalarNode {
			ps = append(ps, Problem{Key: k, Value: nodeText(v), Allowed: "a single value"})
			return
		}
		if !isNull(v) {
			*dst = strings.TrimSpace(v.Value)
		}
	}
	for j := 0; j+1 < len(n.Content); j += 2 {
		name, v := n.Content[j].Value, resolve(n.Content[j+1])
		k := key + "." + name
		switch name {
		case "name":
			scalar(k, v, &p.Name)
		case "topic":
			scalar(k, v, &p.Topic)
		case "format":
			scalar(k, v, &p.Format)
		case "where":
			scalar(k, v, &p.Where)
		case "upsert":
			if isNull(v) {
				continue
			}
			u, ups := loadUpsert(k, v)
			p.Upsert, ps = u, append(ps, ups...)
		case "rollup":
			if isNull(v) {
				continue
			}
			r, rps := loadRollup(k, v)
			p.Rollup, ps = r, append(ps, rps...)
		case "append":
			if isNull(v) {
				continue
			}
			a, aps := loadAppend(k, v)
			p.Append, ps = a, append(ps, aps...)
		case "epoch_millis_window":
			ps = append(ps, loadWindow(k, v, &p.EpochMillisWindow)...)
		case "cost_limit":
			var s string
			if sps := scalarInto(k, v, &s); len(sps) > 0 {
				ps = append(ps, sps...)
				continue
			}
			n, err := strconv.ParseUint(strings.ReplaceAll(s, "_", ""), 10, 64)
			if err != nil || n == 0 {
				ps = append(ps, Problem{Key: k, Value: s, Allowed: "a whole number above 0 (default 1000000)"})
				continue
			}
			p.CostLimit = n
		case "errors":
			if isNull(v) {
				continue
			}
			e, eps := loadPipelineErrors(k, v)
			p.Errors, ps = e, append(ps, eps...)
		default:
			ps = append(ps, unknownIn(k, name, "name", "topic", "format", "where", "upsert", "rollup", "append", "epoch_millis_window", "cost_limit", "errors"))
		}
	}
	return p, ps
}

func unknownIn(k, name string, known ...string) Problem {
	reason := "unknown key"
	if near := nearest(name, known); near != "" {
		reason += " (did you mean " + near + "?)"
	} else {
		reason += " (allowed: " + strings.Join(known, ", ") + ")"
	}
	return Problem{Key: k, Reason: reason}
}

func loadPipelineErrors(key string, n *yaml.Node) (PipelineErrors, []Problem) {
	var e PipelineErrors
	if n.Kind != yaml.MappingNode {
		return e, []Problem{{Key: key, Value: nodeText(n), Allowed: "a mapping with max_ratio, min_failures and window"}}
	}
	var ps []Problem
	for j := 0; j+1 < len(n.Content); j += 2 {
		name, v := n.Content[j].Value, resolve(n.Content[j+1])
		k := key + "." + name
		var s string
		if name == "max_ratio" || name == "min_failures" || name == "window" {
			if sps := scalarInto(k, v, &s); len(sps) > 0 {
				ps = append(ps, sps...)
				continue
			}
		}
		switch name {
		case "max_ratio":
			f, err := strconv.ParseFloat(s, 64)
			if err != nil || !(f > 0 && f <= 1) {
				ps = append(ps, Problem{Key: k, Value: s, Allowed: "a ratio above 0 and at most 1 (1: never stop)"})
				continue
			}
			e.MaxRatio = f
		case "min_failures", "window":
			i, err := strconv.Atoi(s)
			if err != nil || i < 1 || i > 1_000_000 {
				ps = append(ps, Problem{Key: k, Value: s, Allowed: "a whole number from 1 to 1000000"})
				continue
			}
			if name == "window" {
				e.Window = i
			} else {
				e.MinFailures = i
			}
		default:
			ps = append(ps, unknownIn(k, name, "max_ratio", "min_failures", "window"))
		}
	}
	if l := e.Limits(); len(ps) == 0 && l.MinFailures > l.Window {
		ps = append(ps, Problem{Key: key + ".min_failures", Value: strconv.Itoa(l.MinFailures),
			Allowed: fmt.Sprintf("at most the window (%d): more failures than records never happen", l.Window)})
	}
	return e, ps
}

func loadUpsert(key string, n *yaml.Node) (*Upsert, []Problem) {
	u := &Upsert{OnTombstone: TombstoneIgnore}
	if n.Kind != yaml.MappingNode {
		return u, []Problem{{Key: key, Value: nodeText(n), Allowed: "a mapping with table, key, columns and on_tombstone"}}
	}
	var ps []Problem
	for j := 0; j+1 < len(n.Content); j += 2 {
		name, v := n.Content[j].Value, resolve(n.Content[j+1])
		k := key + "." + name
		switch name {
		case "table":
			ps = append(ps, scalarInto(k, v, &u.Table)...)
		case "on_tombstone":
			ps = append(ps, scalarInto(k, v, &u.OnTombstone)...)
		case "version":
			ps = append(ps, scalarInto(k, v, &u.Version)...)
		case "version_column":
			ps = append(ps, scalarInto(k, v, &u.VersionColumn)...)
		case "key":
			var cps []Problem
			u.Key, cps = loadColumns(k, v)
			ps = append(ps, cps...)
		case "columns":
			var cps []Problem
			u.Columns, cps = loadColumns(k, v)
			ps = append(ps, cps...)
		default:
			ps = append(ps, unknownIn(k, name, "table", "key", "columns", "on_tombstone", "version", "version_column"))
		}
	}
	return u, ps
}

func loadAppend(key string, n *yaml.Node) (*Append, []Problem) {
	a := &Append{}
	if n.Kind != yaml.MappingNode {
		return a, []Problem{{Key: key, Value: nodeText(n), Allowed: "a mapping with table and columns"}}
	}
	var ps []Problem
	for j := 0; j+1 < len(n.Content); j += 2 {
		name, v := n.Content[j].Value, resolve(n.Content[j+1])
		k := key + "." + name
		switch name {
		case "table":
			ps = append(ps, scalarInto(k, v, &a.Table)...)
		case "columns":
			var cps []Problem
			a.Columns, cps = loadColumns(k, v)
			ps = append(ps, cps...)
		default:
			ps = append(ps, unknownIn(k, name, "table", "columns"))
		}
	}
	return a, ps
}

func loadRollup(key string, n *yaml.Node) (*Rollup, []Problem) {
	r := &Rollup{}
	if n.Kind != yaml.MappingNode {
		return r, []Problem{{Key: key, Value: nodeText(n), Allowed: "a mapping with table, time, bucket, bucket_column, group_by and aggregates"}}
	}
	var ps []Problem
	for j := 0; j+1 < len(n.Content); j += 2 {
		name, v := n.Content[j].Value, resolve(n.Content[j+1])
		k := key + "." + name
		switch name {
		case "table":
			ps = append(ps, scalarInto(k, v, &r.Table)...)
		case "time":
			ps = append(ps, scalarInto(k, v, &r.Time)...)
		case "bucket_column":
			ps = append(ps, scalarInto(k, v, &r.BucketColumn)...)
		case "bucket":
			var s string
			if bps := scalarInto(k, v, &s); len(bps) > 0 {
				ps = append(ps, bps...)
				continue
			}
			d, err := time.ParseDuration(s)
			if err != nil {
				ps = append(ps, Problem{Key: k, Value: s, Allowed: "a duration from 1s to 24h, such as 1m or 1h"})
				continue
			}
			r.Bucket = d
		case "group_by":
			var cps []Problem
			r.GroupBy, cps = loadColumns(k, v)
			ps = append(ps, cps...)
		case "aggregates":
			var cps []Problem
			r.Aggregates, cps = loadColumns(k, v)
			ps = append(ps, cps...)
		default:
			ps = append(ps, unknownIn(k, name, "table", "time", "bucket", "bucket_column", "group_by", "aggregates"))
		}
	}
	return r, ps
}

// loadWindow reads {past, future}: durations, in Go's units or whole days
// (7305d).
func loadWindow(key string, n *yaml.Node, w *TimeWindow) []Problem {
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return []Problem{{Key: key, Value: nodeText(n), Allowed: "a mapping with past and future, such as {past: 7305d, future: 1d}"}}
	}
	var ps []Problem
	for j := 0; j+1 < len(n.Content); j += 2 {
		name, v := n.Content[j].Value, resolve(n.Content[j+1])
		k := key + "." + name
		var dst *time.Duration
		switch name {
		case "past":
			dst = &w.Past
		case "future":
			dst = &w.Future
		default:
			ps = append(ps, unknownIn(k, name, "past", "future"))
			continue
		}
		var s string
		if sps := scalarInto(k, v, &s); len(sps) > 0 {
			ps = append(ps, sps...)
			continue
		}
		d, ok := parseDays(s)
		if !ok || d <= 0 {
			ps = append(ps, Problem{Key: k, Value: s, Allowed: "a duration above 0, such as 7305d or 36h"})
			continue
		}
		*dst = d
	}
	return ps
}

// parseDays reads a duration in whole days (30d) or as time.ParseDuration
// does.
func parseDays(s string) (time.Duration, bool) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.ParseInt(n, 10, 64)
		if err != nil || days > 100_000 || days < 0 {
			return 0, false
		}
		return time.Duration(days) * 24 * time.Hour, true
	}
	d, err := time.ParseDuration(s)
	return d, err == nil
}

func scalarInto(k string, v *yaml.Node, dst *string) []Problem {
	if v.Kind != yaml.ScalarNode {
		return []Problem{{Key: k, Value: nodeText(v), Allowed: "a single value"}}
	}
	if !isNull(v) {
		*dst = strings.TrimSpace(v.Value)
	}
	return nil
}

// loadColumns reads a mapping of column names to expressions, in order.
func loadColumns(k string, n *yaml.Node) ([]Column, []Problem) {
	if isNull(n) {
		return nil, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, []Problem{{Key: k, Value: nodeText(n), Allowed: "a mapping of column names to CEL expressions"}}
	}
	var out []Column
	var ps []Problem
	for j := 0; j+1 < len(n.Content); j += 2 {
		name, v := strings.TrimSpace(n.Content[j].Value), resolve(n.Content[j+1])
		if v.Kind != yaml.ScalarNode || isNull(v) {
			ps = append(ps, Problem{Key: k + "." + name, Value: nodeText(v), Allowed: "one CEL expression (quote it if it holds a colon or braces)"})
			continue
		}
		out = append(out, Column{Name: name, Expr: strings.TrimSpace(v.Value)})
	}
	return out, ps
}

var (
	pipelineName = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	// identifier is a column name or one part of a table name, as written
	// unquoted in SQL (ratchet quotes them itself).
	identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	tableName  = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*\.)?[A-Za-z_][A-Za-z0-9_]*$`)
)

// validatePipelines checks what can be checked without compiling the
// expressions: names, topics, formats, the sink, columns and the bucket.
func (c Config) validatePipelines(v *validator) {
	if len(c.Pipelines) == 0 {
		return
	}
	names := map[string]int{}
	formats := map[string]string{} // topic → format of its first pipeline
	read := map[string]bool{}
	for i, p := range c.Pipelines {
		k := func(parts ...string) string { return PipelineKey(i, parts...) }
		switch {
		case p.Name == "":
			v.bad(k("name"), "", "a name matching [a-z][a-z0-9_]*")
		case !pipelineName.MatchString(p.Name):
			v.bad(k("name"), p.Name, "a name matching [a-z][a-z0-9_]*")
		default:
			if j, dup := names[p.Name]; dup {
				v.bad(k("name"), p.Name, fmt.Sprintf("a unique name (%s has it too)", PipelineKey(j)))
			} else {
				names[p.Name] = i
			}
		}
		if !slices.Contains(c.Kafka.Topics, p.Topic) {
			v.bad(k("topic"), p.Topic, "one of kafka.topics ("+strings.Join(c.Kafka.Topics, ", ")+")")
		} else {
			read[p.Topic] = true
		}
		switch p.Format {
		case PipelineJSON, PipelineEvent:
		case PipelineAvro, PipelineProtobuf:
			if c.SchemaRegistry.URL == "" {
				v.bad(k("format"), p.Format, "json or event without schema_registry.url (avro and protobuf are read in the registry's wire format)")
			}
		default:
			v.bad(k("format"), p.Format, "json, avro, protobuf or event")
		}
		if p.Format == PipelineEvent && slices.Contains(c.Kafka.Topics, p.Topic) && c.FormatFor(p.Topic) == event.FormatRaw {
			v.bad(k("format"), p.Format, "json, avro or protobuf: topic "+p.Topic+" has kafka format raw, which decodes no event")
		}
		if f, ok := formats[p.Topic]; ok && f != p.Format && p.Topic != "" {
			v.bad(k("format"), p.Format, fmt.Sprintf("%s, as the other pipelines of topic %s (a record is decoded once)", f, p.Topic))
		} else if !ok {
			formats[p.Topic] = p.Format
		}
		sinks := 0
		for _, set := range []bool{p.Upsert != nil, p.Rollup != nil, p.Append != nil} {
			if set {
				sinks++
			}
		}
		switch {
		case sinks == 0:
			v.ps = append(v.ps, Problem{Key: k(), Reason: "no sink: give it upsert, rollup or append"})
		case sinks > 1:
			v.ps = append(v.ps, Problem{Key: k(), Reason: "two sinks: give it one of upsert, rollup or append"})
		case p.Upsert != nil:
			validateUpsert(v, k, p.Upsert)
		case p.Rollup != nil:
			validateRollup(v, k, p.Rollup)
		default:
			validateTable(v, k("append", "table"), p.Append.Table)
			validateColumns(v, k("append", "columns"), p.Append.Columns, map[string]string{}, true)
		}
	}
	for _, t := range c.Kafka.Topics {
		if !read[t] {
			v.ps = append(v.ps, Problem{Key: "kafka.topics", Reason: fmt.Sprintf("topic %s is read by no pipeline (with pipelines, every input topic needs one)", t)})
		}
	}
}

func validateTable(v *validator, key, table string) {
	if !tableName.MatchString(table) {
		v.bad(key, table, "a table name, optionally schema-qualified (schema.table), of letters, digits and _")
	}
}

func validateColumns(v *validator, key string, cols []Column, seen map[string]string, required bool) {
	if required && len(cols) == 0 {
		v.bad(key, "", "one or more column: CEL expression")
	}
	for _, col := range cols {
		ck := key + "." + col.Name
		if !identifier.MatchString(col.Name) {
			v.bad(ck, col.Name, "a column name of letters, digits and _")
			continue
		}
		lc := strings.ToLower(col.Name)
		if other, dup := seen[lc]; dup {
			v.ps = append(v.ps, Problem{Key: ck, Reason: "column " + lc + " is written twice: " + other +
				" writes it too (column names are case-insensitive)"})
			continue
		}
		seen[lc] = ck
		if col.Expr == "" {
			v.bad(ck, "", "a CEL expression")
		}
	}
}

func validateUpsert(v *validator, k func(...string) string, u *Upsert) {
	validateTable(v, k("upsert", "table"), u.Table)
	seen := map[string]string{}
	validateColumns(v, k("upsert", "key"), u.Key, seen, true)
	validateColumns(v, k("upsert", "columns"), u.Columns, seen, false)
	switch u.OnTombstone {
	case "", TombstoneIgnore, TombstoneDelete:
	default:
		v.bad(k("upsert", "on_tombstone"), u.OnTombstone, "delete or ignore")
	}
	switch {
	case u.VersionColumn != "" && u.Version == "":
		v.bad(k("upsert", "version_column"), u.VersionColumn, "nothing without upsert.version (the CEL expression of the version)")
	case u.VersionColumn != "" && !identifier.MatchString(u.VersionColumn):
		v.bad(k("upsert", "version_column"), u.VersionColumn, "a column name of letters, digits and _")
	case u.VersionColumn != "":
		for _, key := range u.Key {
			if strings.EqualFold(key.Name, u.VersionColumn) {
				v.bad(k("upsert", "version_column"), u.VersionColumn, "a column that is not part of upsert.key")
			}
		}
	}
}

func validateRollup(v *validator, k func(...string) string, r *Rollup) {
	validateTable(v, k("rollup", "table"), r.Table)
	if r.Time == "" {
		v.bad(k("rollup", "time"), "", "a CEL expression for the event time (a timestamp, an RFC 3339 string or epoch milliseconds)")
	}
	if r.Bucket < time.Second || r.Bucket > 24*time.Hour || r.Bucket%time.Second != 0 {
		v.bad(k("rollup", "bucket"), fmtDuration(r.Bucket), "a whole number of seconds from 1s to 24h, such as 1m")
	}
	seen := map[string]string{}
	if !identifier.MatchString(r.BucketColumn) {
		v.bad(k("rollup", "bucket_column"), r.BucketColumn, "a timestamptz column name of letters, digits and _")
	} else {
		seen[strings.ToLower(r.BucketColumn)] = k("rollup", "bucket_column")
	}
	validateColumns(v, k("rollup", "group_by"), r.GroupBy, seen, false)
	validateColumns(v, k("rollup", "aggregates"), r.Aggregates, seen, true)
}
