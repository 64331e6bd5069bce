package pipeline

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/google/cel-go/cel"

	"ratchet/config"
)

// FingerprintVersion prefixes every fingerprint: a change of what the
// canonical form holds changes the version, so that fingerprints of two
// forms are never compared as if one.
const FingerprintVersion = "v1"

// Fingerprint returns the fingerprint of p, a hash of what decides what p
// writes, and that definition in canonical form: JSON with sorted keys,
// stored in ratchet_pipeline_definitions.definition and shown as a diff
// when a pipeline's definition changed under its name.
//
// The canonical form holds the topic, the format, where, the sink (its
// kind, table, key, columns, on_tombstone, version and version column;
// a rollup's time, bucket, bucket column, group_by and aggregates), the
// epoch_millis_window and the cost_limit (both decide which records are
// applied and which dead-lettered), defaults filled in. It does not hold
// the name, the failure guard (errors: it stops the topic, it never
// changes a row), the order of the YAML's keys or of the columns (a set of
// column: expression), comments, or how an expression is spaced: each
// expression is parsed and printed back as CEL prints it, so value.a+1
// and value.a + 1 are one definition. Table and column names are compared
// as PostgreSQL folds them (lower case; public. dropped from a table).
//
// p has passed config validation; an expression that does not parse is
// kept as written, trimmed.
func Fingerprint(p config.Pipeline) (fp string, canonical []byte, err error) {
	d := definition(p)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(d); err != nil {
		return "", nil, fmt.Errorf("pipeline %s: canonical definition: %w", p.Name, err)
	}
	canonical = bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	sum := sha256.Sum256(canonical)
	return FingerprintVersion + ":" + hex.EncodeToString(sum[:]), canonical, nil
}

// definition is the canonical form of p as a JSON value: maps (whose keys
// encoding/json sorts), strings and numbers only.
func definition(p config.Pipeline) map[string]any {
	w := p.Window()
	d := map[string]any{
		"version":             FingerprintVersion,
		"topic":               p.Topic,
		"format":              p.Format,
		"epoch_millis_window": map[string]any{"past": w.Past.String(), "future": w.Future.String()},
		"cost_limit":          p.Cost(),
	}
	if p.Where != "" {
		d["where"] = canonicalExpr(p.Where)
	}
	switch {
	case p.Upsert != nil:
		u := p.Upsert
		tomb := u.OnTombstone
		if tomb == "" {
			tomb = config.TombstoneIgnore
		}
		s := map[string]any{
			"table":        tableIdentity(u.Table),
			"key":          columnSet(u.Key),
			"columns":      columnSet(u.Columns),
			"on_tombstone": tomb,
		}
		if u.Version != "" {
			s["version"] = canonicalExpr(u.Version)
			if u.VersionColumn != "" {
				s["version_column"] = strings.ToLower(u.VersionColumn)
			}
		}
		d["upsert"] = s
	case p.Rollup != nil:
		r := p.Rollup
		d["rollup"] = map[string]any{
			"table":         tableIdentity(r.Table),
			"time":          canonicalExpr(r.Time),
			"bucket":        r.Bucket.String(),
			"bucket_column": strings.ToLower(r.BucketColumn),
			"group_by":      columnSet(r.GroupBy),
			"aggregates":    columnSet(r.Aggregates),
		}
	case p.Append != nil:
		d["append"] = map[string]any{
			"table":   tableIdentity(p.Append.Table),
			"columns": columnSet(p.Append.Columns),
		}
	}
	return d
}

// columnSet is cols as a map of column name (lower case, as PostgreSQL
// folds it) to canonical expression: the order of the file writes nothing.
func columnSet(cols []config.Column) map[string]string {
	m := make(map[string]string, len(cols))
	for _, c := range cols {
		m[strings.ToLower(c.Name)] = canonicalExpr(c.Expr)
	}
	return m
}

var (
	parseEnvOnce sync.Once
	parseEnv     *cel.Env
	parseEnvErr  error
)

// canonicalExpr is src parsed and printed back by CEL: spacing, line
// breaks and redundant parentheses do not count (an aggregate such as
// sum(value.x) parses as a call and prints the same way). An expression
// that does not parse stays as written, trimmed: a fingerprint does not
// guess.
func canonicalExpr(src string) string {
	src = strings.TrimSpace(src)
	parseEnvOnce.Do(func() { parseEnv, parseEnvErr = cel.NewEnv() })
	if parseEnvErr != nil {
		return src
	}
	ast, iss := parseEnv.Parse(src)
	if iss != nil && iss.Err() != nil {
		return src
	}
	out, err := cel.AstToString(ast)
	if err != nil {
		return src
	}
	return out
}

// DiffDefinitions returns what differs between two canonical definitions
// (Fingerprint's), a line per leaf that differs, by path, in path order:
// `upsert.columns.amount: "double(value.amount)" → "double(value.total)"`,
// with (none) for a side that does not have it. A definition that is not
// JSON is compared as a whole.
func DiffDefinitions(recorded, configured []byte) []string {
	a, b := map[string]string{}, map[string]string{}
	if !flatten("", recorded, a) || !flatten("", configured, b) {
		if bytes.Equal(recorded, configured) {
			return nil
		}
		return []string{fmt.Sprintf("definition: %s → %s", recorded, configured)}
	}
	paths := make([]string, 0, len(a)+len(b))
	for k := range a {
		paths = append(paths, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			paths = append(paths, k)
		}
	}
	slices.Sort(paths)
	var out []string
	for _, k := range paths {
		va, oka := a[k]
		vb, okb := b[k]
		if oka && okb && va == vb {
			continue
		}
		if !oka {
			va = "(none)"
		}
		if !okb {
			vb = "(none)"
		}
		out = append(out, fmt.Sprintf("%s: %s → %s", k, va, vb))
	}
	return out
}

// flatten puts every leaf of the JSON document doc into out by its dotted
// path, as JSON text.
func flatten(prefix string, doc []byte, out map[string]string) bool {
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		return false
	}
	var walk func(p string, v any)
	walk = func(p string, v any) {
		if m, ok := v.(map[string]any); ok && len(m) > 0 {
			for k, c := range m {
				if p == "" {
					walk(k, c)
				} else {
					walk(p+"."+k, c)
				}
			}
			return
		}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(v) // a value json.Unmarshal made always encodes
		out[p] = strings.TrimSuffix(buf.String(), "\n")
	}
	walk(prefix, v)
	return true
}
