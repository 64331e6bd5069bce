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

// parseTraceparent reads a W3C traceparent value
// ("00-<trace id>-<span id>-<flags>", lower-case hex) without allocating:
// a batch span reads one per record. Versions other than 00 are read by
// their first four fields, as the specification asks of a parser that
// knows version 00 only; version ff, all-zero ids and malformed values
// give an invalid context.
func parseTraceparent(v []byte) trace.SpanContext {
	if len(v) < 55 || (len(v) > 55 && (v[0] == '0' && v[1] == '0' || v[55] != '-')) {
		return trace.SpanContext{}
	}
	if v[2] != '-' || v[35] != '-' || v[52] != '-' || (v[0] == 'f' && v[1] == 'f') {
		return trace.SpanContext{}
	}
	var ver [1]byte
	var tid trace.TraceID
	var sid trace.SpanID
	var flags [1]byte
	if !hexInto(ver[:], v[0:2]) || !hexInto(tid[:], v[3:35]) || !hexInto(sid[:], v[36:52]) || !hexInto(flags[:], v[53:55]) {
		return trace.SpanContext{}
	}
	if !tid.IsValid() || !sid.IsValid() {
		return trace.SpanContext{}
	}
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.TraceFlags(flags[0]) & trace.FlagsSampled, Remote: true,
	})
}

// hexInto decodes lower-case hex src into dst (len(src) = 2 len(dst)).
func hexInto(dst, src []byte) bool {
	for i := range dst {
		hi, ok1 := unhex(src[2*i])
		lo, ok2 := unhex(src[2*i+1])
		if !ok1 || !ok2 {
			return false
		}
		dst[i] = hi<<4 | lo
	}
	return true
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// linkContext is the context a record's last traceparent header names,
// for a link: Extract without the tracestate, and without allocating.
func linkContext(headers []kafka.Header) trace.SpanContext {
	for i := len(headers) - 1; i >= 0; i-- {
		if headers[i].Key == HeaderTraceparent {
			return parseTraceparent(headers[i].Value)
		}
	}
	return trace.SpanContext{}
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
