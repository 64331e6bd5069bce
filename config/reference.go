package config

import (
	"fmt"
	"strings"
)

// KeyDoc documents one configuration key.
type KeyDoc struct {
	Key, Env, Default, Meaning string
}

// Reference documents every key, in a stable order, with its default as
// Default() has it.
func Reference() []KeyDoc {
	d := Default()
	fs := d.orderedFields()
	out := make([]KeyDoc, len(fs))
	for i, f := range fs {
		def := f.display()
		if def == "" {
			def = "(empty)"
		}
		out[i] = KeyDoc{Key: f.key, Env: f.env, Default: def, Meaning: f.meaning}
	}
	return out
}

// ReferenceMarkdown renders Reference as the Markdown table in the README.
func ReferenceMarkdown() string {
	var b strings.Builder
	b.WriteString("| key | environment | default | meaning |\n|---|---|---|---|\n")
	for _, k := range Reference() {
		fmt.Fprintf(&b, "| `%s` | `%s` | `%s` | %s |\n", k.Key, k.Env, k.Default, k.Meaning)
	}
	return b.String()
}
