package tracing

import (
	"context"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"ratchet/processor"
)

// W3C Trace Context header names, as Kafka record headers carry them.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// w3c is the only propagation format ratchet reads and writes.
var w3c = propagation.TraceContext{}

// headerCarrier reads Kafka record headers for the propagator; a key
// present more than once reads as its last value, as processor.Record's
// Header does.
type headerCarrier []kafka.Header

func (c headerCarrier) Get(key string) string {
	for i := len(c) - 1; i >= 0; i-- {
		if c[i].Key == key {
			return string(c[i].Value)
		}
	}
	return ""
}

func (c headerCarrier) Set(string, string) {}

func (c headerCarrier) Keys() []string {
	keys := make([]string, len(c))
	for i, h := range c {
		keys[i] = h.Key
	}
	return keys
}

// Extract returns the span context in headers' `traceparent` (and
// `tracestate`), or an invalid one when there is none or it does not parse.
// Records without the header cost one scan of their header keys.
func Extract(headers []kafka.Header) trace.SpanContext {
	found := false
	for i := range headers {
		if headers[i].Key == HeaderTraceparent {
			found = true
			break
		}
	}
	if !found {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(w3c.Extract(context.Background(), headerCarrier(headers)))
}

// ExtractRef is Extract as a Ref, for a parent or a link.
func ExtractRef(headers []kafka.Header) Ref { return Ref{sc: Extract(headers)} }

// recordCarrier reads a decoded record's headers for the propagator.
type recordCarrier []processor.Header

func (c recordCarrier) Get(key string) string {
	for i := len(c) - 1; i >= 0; i-- {
		if c[i].Key == key {
			return string(c[i].Value)
		}
	}
	return ""
}

func (c recordCarrier) Set(string, string) {}

func (c recordCarrier) Keys() []string {
	keys := make([]string, len(c))
	for i, h := range c {
		keys[i] = h.Key
	}
	return keys
}

// mapCarrier collects what the propagator writes.
type mapCarrier map[string]string

func (m mapCarrier) Get(key string) string { return m[key] }
func (m mapCarrier) Set(key, value string) { m[key] = value }
func (m mapCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

// Inject returns headers without their `traceparent` and `tracestate`
// headers and with sc's instead; headers unchanged when sc is not valid.
// The slice is not modified in place when a header must be removed: a
// record's headers may be shared with what was read from Kafka.
func Inject(sc trace.SpanContext, headers []kafka.Header) []kafka.Header {
	if !sc.IsValid() {
		return headers
	}
	m := mapCarrier{}
	w3c.Inject(trace.ContextWithSpanContext(context.Background(), sc), m)
	out := make([]kafka.Header, 0, len(headers)+2)
	for _, h := range headers {
		if h.Key != HeaderTraceparent && h.Key != HeaderTracestate {
			out = append(out, h)
		}
	}
	if v, ok := m[HeaderTraceparent]; ok {
		out = append(out, kafka.Header{Key: HeaderTraceparent, Value: []byte(v)})
	}
	if v, ok := m[HeaderTracestate]; ok && v != "" {
		out = append(out, kafka.Header{Key: HeaderTracestate, Value: []byte(v)})
	}
	return out
}
