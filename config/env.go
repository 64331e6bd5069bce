package config

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// envPrefix starts every variable this package reads.
const envPrefix = "RATCHET_"

// applyEnv overlays the RATCHET_* variables of environ on c. It returns
// the problems and, by key, the variable that set each key. When a
// variable appears more than once the last one wins, as with exec.Cmd.Env.
func (c *Config) applyEnv(environ []string) ([]Problem, map[string]string) {
	values := map[string]string{}
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		if ok && strings.HasPrefix(name, envPrefix) {
			values[name] = value
		}
	}
	names := make([]string, 0, len(values))
	for name := range values {
		names = append(names, name)
	}
	sort.Strings(names)

	byEnv := make(map[string]key, len(keys))
	envNames := make([]string, len(keys))
	for i, k := range keys {
		byEnv[k.env()] = k
		envNames[i] = k.env()
	}
	ours := sections()

	fromEnv := map[string]string{}
	var ps []Problem
	for _, name := range names {
		k, ok := byEnv[name]
		if !ok {
			rest := strings.ToLower(strings.TrimPrefix(name, envPrefix))
			if rest == "pipelines" || strings.HasPrefix(rest, "pipelines_") {
				ps = append(ps, Problem{Env: name, Reason: "pipelines are read from the configuration file only (pipelines: in the YAML file)"})
				continue
			}
			if slices.ContainsFunc(ours, func(s string) bool { return strings.HasPrefix(rest, s+"_") }) {
				reason := "unknown variable"
				if near := nearest(name, envNames); near != "" {
					reason += " (did you mean " + near + "?)"
				}
				ps = append(ps, Problem{Env: name, Reason: reason})
			}
			continue
		}
		fromEnv[k.name] = name
		if err := setText(k.field(c), values[name]); err != nil {
			ps = append(ps, Problem{Key: k.name, Env: name, Value: quoteText(k.field(c), values[name]), Allowed: err.Error()})
		}
	}
	return ps, fromEnv
}

// envOf returns the variable that set key, or that set the key a
// sub-key belongs to (kafka.properties for kafka.properties.group.id).
func envOf(name string, fromEnv map[string]string) string {
	for k, env := range fromEnv {
		if name == k || strings.HasPrefix(name, k+".") {
			return env
		}
	}
	return ""
}

// splitList parses a comma-separated list, dropping empty items and the
// spaces around each item.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// parseMap parses comma-separated name=value pairs. A value cannot
// contain a comma; such values belong in the YAML file.
func parseMap(s string) (map[string]string, error) {
	m := map[string]string{}
	for _, p := range splitList(s) {
		k, v, ok := strings.Cut(p, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("comma-separated name=value pairs (a value with a comma belongs in the YAML file)")
		}
		m[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return m, nil
}

// quoteText renders text that did not parse into the field p points to,
// for a problem line, without secrets.
func quoteText(p any, s string) string {
	switch p.(type) {
	case *SecretURL:
		return SecretURL(strings.TrimSpace(s)).String()
	case *Secret:
		return redacted
	case *Properties:
		return quoteProperties(s)
	}
	return s
}

// quoteProperties renders kafka.properties text for a problem line. Pairs
// that parse show with sensitive values redacted; text that does not parse
// is redacted whole when any part of it names a secret, since a value with
// a comma leaves pieces of the secret without a name.
func quoteProperties(s string) string {
	if m, err := parseMap(s); err == nil {
		return showMap(m, SensitiveProperty)
	}
	for _, piece := range splitList(s) {
		name, _, _ := strings.Cut(piece, "=")
		if SensitiveProperty(name) || SensitiveProperty(piece) {
			return redacted
		}
	}
	return s
}

// nearest returns the candidate closest to name when it is close enough to
// be a likely typo, or "".
func nearest(name string, candidates []string) string {
	best, bestDist := "", 3 // at most two edits
	for _, c := range candidates {
		if d := editDistance(strings.ToLower(name), strings.ToLower(c)); d < bestDist {
			best, bestDist = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
