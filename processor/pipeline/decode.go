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
// bools and null as themselves; a number beyond float64's range (1e400)
// makes the value poison ("number out of range"): no CEL value holds it.
// A null record value (a tombstone) decodes to nothing and is not poison. With a schema registry configured, a
// value in the registry's JSON Schema wire format (magic byte 0, a 4-byte
// schema id) has its 5-byte header skipped: a JSON document never starts
// with a zero byte.
type JSONDecoder struct {
	// Framed says a schema registry is configured, so a leading zero byte
	// is the wire format's magic byte.
	Framed bool
	// reads, when set, is what the expressions of the topic read of the
	// value: only that is built (decodePartial: objects read at some keys
	// become *object, which the expressions read as those maps), the rest
	// of the document checked and skipped. Set.JSONDecoder sets it.
	reads *fieldTree
	// objects is where a partition's partly decoded objects are carved
	// from (Set.JSONDecoder makes one for each decoder it returns).
	objects *objects
}

// JSONDecoder returns the decoder of topic's values, whose pipelines have
// format json: it builds only the fields their expressions read (all of
// the document when one of them uses value as a whole), refusing exactly
// what DecodeJSON refuses, with the same reasons. Each decoder it returns
// is one partition's: it carves the objects it builds from chunks of its
// own, and is not for concurrent use.
func (s *Set) JSONDecoder(topic string, framed bool) JSONDecoder {
	return JSONDecoder{Framed: framed, reads: s.reads[topic], objects: &objects{}}
}

// DecodeRecord implements the engine's per-partition value decoder. The
// strings of a partly decoded value share rec.Value's bytes (Kafka's
// records are never changed once read), so rec.Value must not change
// while rec.Decoded is in use.
func (d JSONDecoder) DecodeRecord(rec *processor.Record) error {
	if rec.Value == nil {
		return nil // tombstone
	}
	var v any
	var err error
	if d.reads != nil && !d.reads.whole {
		v, err = decodePartial(rec.Value, d.Framed, d.reads, d.objects)
	} else {
		v, err = DecodeJSON(rec.Value, d.Framed)
	}
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
	if err := numbers(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// errNumberRange refuses a number no float64 holds. Its text names no
// digits: they are the record's value.
var errNumberRange = errors.New("json: number out of range (beyond ±1.8e308)")

// numbers replaces json.Number with int64 or float64, in place.
func numbers(p *any) error {
	switch x := (*p).(type) {
	case map[string]any:
		for k, e := range x {
			if err := numbers(&e); err != nil {
				return err
			}
			x[k] = e
		}
	case []any:
		for i := range x {
			if err := numbers(&x[i]); err != nil {
				return err
			}
		}
	case json.Number:
		n, err := numberOf(string(x))
		if err != nil {
			return err
		}
		*p = n
	}
	return nil
}

// numberOf is the int64 or float64 of a JSON number: an int64 when it is
// an integer that fits, else a float64; errNumberRange when no float64
// holds it. It keeps no reference to s.
func numberOf(s string) (any, error) {
	if !strings.ContainsAny(s, ".eE") {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return n, nil
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return nil, errNumberRange
	}
	return f, nil
}
