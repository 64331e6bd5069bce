package config

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

// TestConfigReferenceDoc keeps the configuration table of
// docs/configuration.md (the full list of keys the README points to) equal
// to ReferenceMarkdown. When it fails, paste the printed table between the
// markers.
func TestConfigReferenceDoc(t *testing.T) {
	const begin, end = "<!-- config-reference:begin -->\n", "<!-- config-reference:end -->"
	want := ReferenceMarkdown()
	const doc = "docs/configuration.md"
	raw, err := os.ReadFile("../" + doc)
	if err != nil {
		t.Fatalf("read %s: %v\nit must contain, between the lines %q and %q:\n%s", doc, err, strings.TrimSpace(begin), end, want)
	}
	s := string(raw)
	i := strings.Index(s, begin)
	j := strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("%s has no %q ... %q section; it must contain, between those lines:\n%s", doc, strings.TrimSpace(begin), end, want)
	}
	if got := s[i+len(begin) : j]; got != want {
		t.Errorf("the configuration reference in %s is out of date; replace the lines between the markers with:\n%s", doc, want)
	}
}

// TestReferenceDefaultsMatchDefault parses every documented default back
// and compares it with the value Default has.
func TestReferenceDefaultsMatchDefault(t *testing.T) {
	refs := Reference()
	if len(refs) != len(keys) {
		t.Fatalf("Reference has %d keys, want %d", len(refs), len(keys))
	}
	d := Default()
	seen := map[string]bool{}
	for i, ref := range refs {
		t.Run(ref.Key, func(t *testing.T) {
			k := keys[i]
			if ref.Key != k.name || seen[ref.Key] {
				t.Fatalf("key %d is %q, want %q once", i, ref.Key, k.name)
			}
			seen[ref.Key] = true
			if want := "RATCHET_" + strings.ToUpper(strings.ReplaceAll(ref.Key, ".", "_")); ref.Env != want {
				t.Errorf("environment %q, want %q", ref.Env, want)
			}
			if ref.Meaning == "" || strings.Contains(ref.Meaning, "|") {
				t.Errorf("meaning %q must be non-empty and free of |", ref.Meaning)
			}
			text := ref.Default
			if text == "(empty)" || text == "{}" {
				text = ""
			}
			want := k.field(&d)
			got := reflect.New(reflect.TypeOf(want).Elem()).Interface()
			if err := setText(got, text); err != nil {
				t.Fatalf("documented default %q does not parse: %v", ref.Default, err)
			}
			g, w := reflect.ValueOf(got).Elem(), reflect.ValueOf(want).Elem()
			if g.Kind() == reflect.Map && g.Len() == 0 && w.Len() == 0 {
				return // {} and an empty map
			}
			if !reflect.DeepEqual(g.Interface(), w.Interface()) {
				t.Errorf("documented default %q parses to %v, Default() has %v", ref.Default, g, w)
			}
		})
	}
}

// TestEveryFieldHasOneKey guards against a field added to Config without a
// key (it could be neither set nor documented) and two keys on one field.
func TestEveryFieldHasOneKey(t *testing.T) {
	var c Config
	fields := map[uintptr]string{}
	root := reflect.ValueOf(&c).Elem()
	for i := range root.NumField() {
		if root.Type().Field(i).Name == "Pipelines" {
			continue // a list read from the file only, documented in docs/pipelines.md
		}
		section := root.Field(i)
		for j := range section.NumField() {
			fields[section.Field(j).Addr().Pointer()] = root.Type().Field(i).Name + "." + section.Type().Field(j).Name
		}
	}
	bound := map[uintptr]bool{}
	for _, k := range keys {
		p := reflect.ValueOf(k.field(&c)).Pointer()
		if _, ok := fields[p]; !ok {
			t.Errorf("%s points outside Config", k.name)
		}
		if bound[p] {
			t.Errorf("%s shares its field with another key", k.name)
		}
		bound[p] = true
	}
	for p, name := range fields {
		if !bound[p] {
			t.Errorf("field %s has no key", name)
		}
	}
}

func TestReferenceMarkdown(t *testing.T) {
	md := ReferenceMarkdown()
	lines := strings.Split(strings.TrimSuffix(md, "\n"), "\n")
	if lines[0] != "| key | environment | default | meaning |" || lines[1] != "|---|---|---|---|" {
		t.Errorf("header:\n%s\n%s", lines[0], lines[1])
	}
	if len(lines) != 2+len(keys) {
		t.Errorf("%d rows, want %d", len(lines)-2, len(keys))
	}
	for _, want := range []string{
		"| `kafka.brokers` | `RATCHET_KAFKA_BROKERS` | `localhost:9092` |",
		"| `kafka.dlq_topic` | `RATCHET_KAFKA_DLQ_TOPIC` | `(empty)` |",
		"| `supervision.within` | `RATCHET_SUPERVISION_WITHIN` | `1m` |",
		"| `processing.batch_linger` | `RATCHET_PROCESSING_BATCH_LINGER` | `20ms` |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("table has no row starting %s", want)
		}
	}
}
