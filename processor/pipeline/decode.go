package pipeline

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"ratchet/processor"
)

// JSONDecoder decodes the values of a topic whose pipelines have format
// json into Record.Decoded: objects become map[string]any, arrays []any,
// numbers int64 when they are integers that fit (else float64), strings,
// bools and null as themselves. A null record value (a tombstone) decodes
// to nothing and is not poison. With a schema registry configured, a
// value in the registry's JSON Schema wire format (magic byte 0, a 4-byte
// schema id) has its 5-byte header skipped: a JSON document never starts
// with a zero byte.
type JSONDecoder struct {
	// Framed says a schema registry is configured, so a leading zero byte
	// is the wire format's magic byte.
	Framed bool
}

// DecodeRecord implements the engine's per-partition value decoder.
func (d JSONDecoder) DecodeRecord(rec *processor.Record) error {
	if rec.Value == nil {
		return nil // tombstone
	}
	v, err := DecodeJSON(rec.Value, d.Framed)
	if err != nil {
		return err
	}
	rec.Decoded = v
	return nil
}

// DecodeJSON decodes one JSON document as JSONDecoder does.
func DecodeJSON(b []byte, framed bool) (any, error) {
	if len(b) > 0 && b[0] == 0 {
		if !framed {
			return nil, errors.New("json: value starts with a zero byte (the schema registry's wire format) but schema_registry.url is not set")
		}
		if len(b) < 5 {
			return nil, errors.New("json: value shorter than the schema registry's 5-byte header")
		}
		b = b[5:]
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("json: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("json: more than one JSON value")
	}
	return numbers(v), nil
}

// numbers replaces json.Number with int64 or float64, in place.
func numbers(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = numbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = numbers(e)
		}
	case json.Number:
		s := string(x)
		if !strings.ContainsAny(s, ".eE") {
			if n, err := strconv.ParseInt(s, 10, 64); err == nil {
				return n
			}
		}
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return s // out of float64 range: keep the digits
		}
		return f
	}
	return v
}
