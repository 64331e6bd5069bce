package pipeline

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/checker"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/ext"

	"ratchet/config"
	ratchetv1 "ratchet/messages/ratchet/v1"
)

// Aggregate kinds of a rollup.
const (
	aggCount = "count"
	aggSum   = "sum"
	aggMin   = "min"
	aggMax   = "max"
)

// Set is the compiled pipelines of a configuration, grouped by topic. It
// is immutable after Compile and safe for concurrent use.
type Set struct {
	pipelines []*pipeline
	byTopic   map[string][]*pipeline
	// formats is the pipeline format of each topic (one per topic).
	formats map[string]string
	// adapter converts Go values to CEL values (the environment's).
	adapter types.Adapter
	// reads is, per topic, what the expressions of its pipelines read of
	// value (reads.go): its JSON decoder builds only that.
	reads map[string]*fieldTree
}

// pipeline is one compiled pipeline.
type pipeline struct {
	index  int // position in the pipelines list, for key paths
	name   string
	topic  string
	format string
	// fingerprint is the definition's (Fingerprint), recorded with the
	// pipeline's origin on each partition.
	fingerprint string
	where       *expr // nil: every record
	upsert      *upsertSink
	rollup      *rollupSink
	append      *appendSink
}

// expr is one compiled CEL expression and where it came from.
type expr struct {
	key  string // its key path, e.g. pipelines[0].upsert.columns.amount
	src  string
	prg  cel.Program
	out  *cel.Type
	name string // the column it writes, if any
	// path is set when the expression is a field path of value
	// (value.a.b): the field names, evaluated without the interpreter
	// when the value allows (see fast).
	path []string
	// form is set when the expression has one (see form): it is then
	// evaluated without the interpreter when the record allows. fastLen
	// bounds the strings it converts or compares (see fastLen; < 0: any).
	form    *form
	fastLen int
	// times bounds the times given as numbers (toTime); costLimit is its
	// pipeline's cost_limit, which bounds each evaluation.
	times     timeBounds
	costLimit uint64
	// bounded is set when the expression's cost is within costLimit
	// whatever the record: it is evaluated without tracking its cost or
	// looking at the context.
	bounded bool
}

type upsertSink struct {
	table       string
	key         []*expr
	columns     []*expr
	deleteOnNil bool // on_tombstone: delete
	// version (upsert.version), when set, is written to versionColumn, the
	// statement's last column: a row is replaced only by a record whose
	// version is not older. columns does not hold versionColumn.
	version       *expr
	versionColumn string
	versionKey    string // the key path check names for the column
}

// appendSink inserts one row per record, with COPY.
type appendSink struct {
	table   string
	columns []*expr
}

type rollupSink struct {
	table        string
	time         *expr
	bucket       time.Duration
	bucketColumn string
	groupBy      []*expr
	aggregates   []*aggregate
}

// aggregate is one aggregate column: count, or sum/min/max of arg.
type aggregate struct {
	column string
	kind   string
	arg    *expr // nil for count
	key    string
}

// newEnv returns the CEL environment of pipeline expressions: value (the
// decoded record value, any type) and record (its Kafka metadata). With
// withValue false, value is not declared: an expression that compiles
// there does not read the value (tombstone deletes need such keys).
func newEnv(withValue bool) (*cel.Env, error) {
	opts := []cel.EnvOption{
		cel.Variable("record", cel.MapType(cel.StringType, cel.DynType)),
		cel.Types(&ratchetv1.Event{}),
		ext.Strings(), ext.Encoders(), ext.Math(), cel.OptionalTypes(),
	}
	if withValue {
		opts = append(opts, cel.Variable("value", cel.DynType))
	}
	return cel.NewEnv(opts...)
}

// Compile compiles the pipelines of cfg, which has passed cfg.Validate.
// Every expression that does not compile, a where that cannot be a bool, an
// aggregate that is not count, sum(E), min(E) or max(E), and a tombstone
// delete whose key reads value are reported together as a *config.Error,
// one line per problem naming its key path. Compile returns nil, nil when
// cfg has no pipelines.
func Compile(cfg config.Config) (*Set, error) {
	if len(cfg.Pipelines) == 0 {
		return nil, nil
	}
	env, err := newEnv(true)
	if err != nil {
		return nil, fmt.Errorf("pipelines: CEL environment: %w", err)
	}
	noValue, err := newEnv(false)
	if err != nil {
		return nil, fmt.Errorf("pipelines: CEL environment: %w", err)
	}
	c := &compiler{env: env, noValue: noValue}
	s := &Set{byTopic: map[string][]*pipeline{}, formats: map[string]string{}, adapter: env.CELTypeAdapter(),
		reads: map[string]*fieldTree{}}
	for i, pc := range cfg.Pipelines {
		p := &pipeline{index: i, name: pc.Name, topic: pc.Topic, format: pc.Format}
		if s.reads[pc.Topic] == nil {
			s.reads[pc.Topic] = &fieldTree{}
		}
		c.reads = s.reads[pc.Topic]
		c.times, c.costLimit = boundsOf(pc), pc.Cost()
		if pc.Where != "" {
			p.where = c.compile(config.PipelineKey(i, "where"), pc.Where, "")
			if p.where != nil && !canBe(p.where.out, cel.BoolType) {
				c.bad(p.where.key, pc.Where, "a CEL expression that yields a bool (this one yields "+p.where.out.String()+")")
			}
		}
		switch {
		case pc.Upsert != nil:
			p.upsert = c.upsert(i, pc.Upsert)
		case pc.Rollup != nil:
			p.rollup = c.rollup(i, pc.Rollup)
		case pc.Append != nil:
			p.append = &appendSink{table: pc.Append.Table,
				columns: c.columns(config.PipelineKey(i, "append", "columns"), pc.Append.Columns)}
		}
		s.pipelines = append(s.pipelines, p)
		s.byTopic[p.topic] = append(s.byTopic[p.topic], p)
		s.formats[p.topic] = p.format
		if p.fingerprint, _, err = Fingerprint(pc); err != nil {
			return nil, err
		}
	}
	c.sharedTables(s.pipelines)
	if len(c.ps) > 0 {
		return nil, &config.Error{Problems: c.ps}
	}
	return s, nil
}

// sharedTables refuses two pipelines writing one table when one of them
// is an upsert: each pipeline writes its rows in its own statements, so
// the order of the two pipelines' writes would be the order of the
// pipelines, not of the records, and where a batch was cut would decide
// which record's row is left (a tombstone of one deleting a later insert
// of the other). Rollups may share a table with rollups, appends with
// appends: their writes commute (count and sum add, min and max combine;
// appended rows are a set). An append and a rollup may not: the rollup's
// unique key would refuse the appended row or not depending on which
// came first. The problem names the later
// pipeline's table key and the earlier pipeline.
func (c *compiler) sharedTables(pls []*pipeline) {
	first := map[string]*pipeline{}
	for _, p := range pls {
		name := tableIdentity(sinkTable(p))
		other, ok := first[name]
		if !ok {
			first[name] = p
			continue
		}
		if (p.rollup != nil && other.rollup != nil) || (p.append != nil && other.append != nil) {
			continue
		}
		c.ps = append(c.ps, config.Problem{Key: config.PipelineKey(p.index, p.sinkName(), "table"),
			Reason: fmt.Sprintf("pipeline %s writes table %s, which pipeline %s (pipelines[%d]) writes too: "+
				"two pipelines may share a table only when both are rollups or both are appends (give this one a table of its own)",
				p.name, sinkTable(p), other.name, other.index)})
	}
}

// tableIdentity is the table a configured name reaches as PostgreSQL
// folds it: lower case, and public. dropped (the schema of an unqualified
// name under the default search_path).
func tableIdentity(name string) string {
	name = strings.ToLower(name)
	return strings.TrimPrefix(name, "public.")
}

type compiler struct {
	env, noValue *cel.Env
	ps           []config.Problem
	// times and costLimit are those of the pipeline being compiled.
	times     timeBounds
	costLimit uint64
	// reads gathers what the expressions of the topic being compiled
	// read of value.
	reads *fieldTree
}

func (c *compiler) bad(key, value, allowed string) {
	c.ps = append(c.ps, config.Problem{Key: key, Value: value, Allowed: allowed})
}

// compile compiles src; a problem is recorded and nil returned when it
// does not compile.
func (c *compiler) compile(key, src, column string) *expr {
	limit := c.costLimit
	if limit == 0 {
		limit = config.DefaultCostLimit
	}
	ast, iss := c.env.Compile(src)
	if iss != nil && iss.Err() != nil {
		c.ps = append(c.ps, config.Problem{Key: key, Reason: "CEL does not compile: " + oneLine(iss.Err().Error())})
		return nil
	}
	// An expression that costs more than the limit on any record is the
	// configuration's fault, not every record's: refuse it here. One that
	// could cost more only on a large value (a comprehension over a list
	// of the record) is fine; the limit stops that record alone.
	est, err := c.env.EstimateCost(ast, noSizes{})
	if err != nil {
		est = checker.CostEstimate{Max: math.MaxUint64} // unknown: bounded at run time
	}
	if est.Min > limit {
		c.ps = append(c.ps, config.Problem{Key: key, Reason: fmt.Sprintf(
			"CEL costs at least %d on any record, over the pipeline's cost_limit %d", est.Min, limit)})
		return nil
	}
	// Whatever a record holds, an evaluation stops at the cost limit (a
	// record error) and within interruptEvery steps of a comprehension
	// after the batch's context ends (the batch waits to be retried). An
	// expression whose cost is bounded within the limit whatever the
	// record (no comprehension, no string or list work that grows with
	// the value: value.a.b, double(value.amount) * 2.0) needs neither,
	// and is spared their cost per evaluation (a cost tracker and a
	// context: with them on every expression, the order pipelines of the
	// tests took 85 allocations per record instead of 49; 56 now).
	opts := []cel.ProgramOption{cel.EvalOptions(cel.OptOptimize)}
	bounded := est.Max <= limit
	if !bounded {
		opts = append(opts, cel.CostLimit(limit), cel.InterruptCheckFrequency(interruptEvery))
	}
	prg, err := c.env.Program(ast, opts...)
	if err != nil {
		c.ps = append(c.ps, config.Problem{Key: key, Reason: "CEL program: " + oneLine(err.Error())})
		return nil
	}
	if c.reads != nil {
		readsOf(ast.NativeRep().Expr(), c.reads)
	}
	e := &expr{key: key, src: src, prg: prg, out: ast.OutputType(), name: column, times: c.times, costLimit: limit, bounded: bounded}
	if fieldPath.MatchString(src) {
		e.path = strings.Split(src, ".")[1:]
	}
	if f := formOf(ast.NativeRep().Expr()); f != nil {
		if n, ok := fastLen(bounded, limit); ok {
			e.form, e.fastLen = f, n
		}
	}
	return e
}

// interruptEvery is how many steps of a comprehension run between two
// looks at the batch's context: a step costs microseconds at most.
const interruptEvery = 100

// noSizes is a cost estimator that knows nothing of the record's sizes:
// the estimate's minimum is then what the expression costs on any record.
type noSizes struct{}

func (noSizes) EstimateSize(checker.AstNode) *checker.SizeEstimate { return nil }

func (noSizes) EstimateCallCost(string, string, *checker.AstNode, []checker.AstNode) *checker.CallEstimate {
	return nil
}

// fieldPath matches an expression that only selects fields of value.
var fieldPath = regexp.MustCompile(`^value(\.[A-Za-z_][A-Za-z0-9_]*)+$`)

// readsValue reports whether src needs the variable value.
func (c *compiler) readsValue(src string) bool {
	_, iss := c.noValue.Compile(src)
	return iss != nil && iss.Err() != nil
}

func (c *compiler) columns(key string, cols []config.Column) []*expr {
	out := make([]*expr, 0, len(cols))
	for _, col := range cols {
		if e := c.compile(key+"."+col.Name, col.Expr, strings.ToLower(col.Name)); e != nil {
			out = append(out, e)
		}
	}
	return out
}

func (c *compiler) upsert(i int, u *config.Upsert) *upsertSink {
	s := &upsertSink{table: u.Table, deleteOnNil: u.OnTombstone == config.TombstoneDelete}
	s.key = c.columns(config.PipelineKey(i, "upsert", "key"), u.Key)
	s.columns = c.columns(config.PipelineKey(i, "upsert", "columns"), u.Columns)
	c.version(i, u, s)
	if s.deleteOnNil {
		for _, k := range u.Key {
			if c.readsValue(k.Expr) {
				c.bad(config.PipelineKey(i, "upsert", "key", k.Name), k.Expr,
					"an expression of record only (a tombstone has no value, and on_tombstone is delete), e.g. string(record.key)")
			}
		}
	}
	return s
}

// version compiles upsert.version and picks the column that stores it:
// upsert.version_column if set, else the column of upsert.columns whose
// expression is the version's (as written), else "version". A column of
// upsert.columns that is the version column must have the version's
// expression: it is written from upsert.version.
func (c *compiler) version(i int, u *config.Upsert, s *upsertSink) {
	if u.Version == "" {
		return
	}
	key := config.PipelineKey(i, "upsert", "version")
	s.version = c.compile(key, u.Version, "")
	if s.version == nil {
		return
	}
	if !canBe(s.version.out, cel.TimestampType, cel.StringType, cel.IntType, cel.UintType, cel.DoubleType) {
		c.bad(key, u.Version, "a timestamp, an RFC 3339 string or a number (this one yields "+s.version.out.String()+")")
	}
	s.versionColumn, s.versionKey = strings.ToLower(u.VersionColumn), config.PipelineKey(i, "upsert", "version_column")
	if s.versionColumn == "" {
		s.versionColumn, s.versionKey = "version", key
		for _, col := range u.Columns {
			if strings.TrimSpace(col.Expr) == strings.TrimSpace(u.Version) {
				s.versionColumn = strings.ToLower(col.Name)
				s.versionKey = config.PipelineKey(i, "upsert", "columns", col.Name)
				break
			}
		}
	}
	for j, col := range s.columns {
		if col.name != s.versionColumn {
			continue
		}
		if strings.TrimSpace(col.src) != strings.TrimSpace(u.Version) {
			c.bad(col.key, col.src, "the version's expression ("+u.Version+"): column "+col.name+
				" stores upsert.version (drop it from columns, or set upsert.version_column to another column)")
		}
		s.columns = slices.Delete(s.columns, j, j+1)
		break
	}
	s.version.name = s.versionColumn
}

func (c *compiler) rollup(i int, r *config.Rollup) *rollupSink {
	s := &rollupSink{table: r.Table, bucket: r.Bucket, bucketColumn: strings.ToLower(r.BucketColumn)}
	s.time = c.compile(config.PipelineKey(i, "rollup", "time"), r.Time, "")
	if s.time != nil && !canBe(s.time.out, cel.TimestampType, cel.StringType, cel.IntType, cel.UintType, cel.DoubleType) {
		c.bad(s.time.key, r.Time, "a timestamp, an RFC 3339 string or epoch milliseconds (this one yields "+s.time.out.String()+")")
	}
	s.groupBy = c.columns(config.PipelineKey(i, "rollup", "group_by"), r.GroupBy)
	for _, a := range r.Aggregates {
		key := config.PipelineKey(i, "rollup", "aggregates", a.Name)
		kind, arg, ok := parseAggregate(a.Expr)
		if !ok {
			if why := unbalanced(a.Expr); why != "" {
				c.ps = append(c.ps, config.Problem{Key: key, Reason: why})
				continue
			}
			c.bad(key, a.Expr, "count, sum(E), min(E) or max(E) with E a CEL expression")
			continue
		}
		ag := &aggregate{column: strings.ToLower(a.Name), kind: kind, key: key}
		if kind != aggCount {
			if ag.arg = c.compile(key, arg, ""); ag.arg == nil {
				continue
			}
			if !canBe(ag.arg.out, cel.IntType, cel.UintType, cel.DoubleType) {
				c.bad(key, a.Expr, kind+" of a number (int, uint or double; this one yields "+ag.arg.out.String()+")")
				continue
			}
		}
		s.aggregates = append(s.aggregates, ag)
	}
	return s
}

// parseAggregate splits "count", "sum(E)", "min(E)" or "max(E)". The
// parentheses must enclose all of E: "sum(a) + sum(b)" is not one.
func parseAggregate(s string) (kind, arg string, ok bool) {
	s = strings.TrimSpace(s)
	if s == aggCount || s == aggCount+"()" {
		return aggCount, "", true
	}
	for _, k := range []string{aggSum, aggMin, aggMax} {
		rest, found := strings.CutPrefix(s, k)
		if !found {
			continue
		}
		rest = strings.TrimSpace(rest)
		if !strings.HasPrefix(rest, "(") || !strings.HasSuffix(rest, ")") || closing(rest) != len(rest)-1 {
			return "", "", false
		}
		arg = strings.TrimSpace(rest[1 : len(rest)-1])
		return k, arg, arg != ""
	}
	return "", "", false
}

// parens calls visit with the index of each parenthesis of s outside
// string literals, in order, and whether it opens; visit returns false to
// stop.
func parens(s string, visit func(i int, opens bool) bool) {
	var quote byte
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case quote != 0:
			if ch == '\\' {
				i++
			} else if ch == quote {
				quote = 0
			}
		case ch == '"' || ch == '\'':
			quote = ch
		case ch == '(' || ch == ')':
			if !visit(i, ch == '(') {
				return
			}
		}
	}
}

// closing returns the index of the parenthesis that closes s[0], skipping
// string literals; -1 when there is none.
func closing(s string) int {
	depth, at := 0, -1
	parens(s, func(i int, opens bool) bool {
		if opens {
			depth++
			return true
		}
		depth--
		if depth == 0 {
			at = i
			return false
		}
		return true
	})
	return at
}

// unbalanced says which parenthesis of s is not matched, skipping string
// literals; "" when they all are.
func unbalanced(s string) string {
	var open []int
	why := ""
	parens(s, func(i int, opens bool) bool {
		switch {
		case opens:
			open = append(open, i)
		case len(open) == 0:
			why = fmt.Sprintf("unbalanced parentheses: the ) at column %d closes nothing", i+1)
			return false
		default:
			open = open[:len(open)-1]
		}
		return true
	})
	if why == "" && len(open) > 0 {
		why = fmt.Sprintf("unbalanced parentheses: the ( at column %d is not closed", open[len(open)-1]+1)
	}
	return why
}

// canBe reports whether a value of static type t may be one of want at run
// time: t is one of them, or dyn (checked per record then).
func canBe(t *cel.Type, want ...*cel.Type) bool {
	if t == nil || t.IsExactType(cel.DynType) || t.Kind() == cel.DynKind || t.Kind() == cel.AnyKind {
		return true
	}
	for _, w := range want {
		if t.IsExactType(w) {
			return true
		}
	}
	return false
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// Names returns the pipelines' names in configuration order.
func (s *Set) Names() []string {
	out := make([]string, len(s.pipelines))
	for i, p := range s.pipelines {
		out[i] = p.name
	}
	return out
}

// Format returns the pipeline format of topic's records, and false when
// no pipeline reads topic.
func (s *Set) Format(topic string) (string, bool) {
	f, ok := s.formats[topic]
	return f, ok
}
