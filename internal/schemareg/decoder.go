package schemareg

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"ratchet/internal/event"
	"ratchet/internal/metrics"
	"ratchet/processor"
)

// maxKnown bounds the schemas one Decoder remembers; past it the map is
// cleared and the schemas are learned again (from the Registry's cache).
const maxKnown = 4096

// Decoder decodes the framed values of one partition (the partition's value
// decoder and Resolver). Its map of learned schemas is touched only on the
// partition's goroutine (Missing, DecodeRecord, the learn function);
// Resolve only reads the shared Registry.
type Decoder struct {
	reg    *Registry
	format string // event.FormatProtobuf or event.FormatJSON
	inner  *event.Decoder
	known  map[int32]*Schema
	hits   prometheus.Counter
	now    func() time.Time // the Registry's clock
}

// NewDecoder returns the Decoder of one partition for values framed
// around format (protobuf or json).
func NewDecoder(reg *Registry, format string, m *metrics.Metrics) *Decoder {
	if format == "" {
		format = event.FormatProtobuf
	}
	now := time.Now
	if reg != nil {
		now = reg.now
	}
	return &Decoder{reg: reg, format: format, inner: event.NewDecoder(format), known: map[int32]*Schema{},
		hits: m.RegistryCacheHits, now: now}
}

// Missing reports whether value carries a schema id this Decoder has not
// learned, or learned as unknown more than notFoundTTL ago (the id is
// asked again: its schema may have been registered since). A value that
// is not framed needs no lookup: it is poison.
func (d *Decoder) Missing(value []byte) bool {
	id, ok := event.SchemaIDOf(value)
	if !ok {
		return false
	}
	s, known := d.known[id]
	return !known || s.NotFound && !d.now().Before(s.retryAt)
}

// Resolve looks up the schema ids of values; learn adds them to the
// Decoder's map. An error wraps ErrUnavailable (or is ctx's).
func (d *Decoder) Resolve(ctx context.Context, values [][]byte) (func(), error) {
	found := map[int32]*Schema{}
	for _, v := range values {
		id, ok := event.SchemaIDOf(v)
		if !ok || found[id] != nil {
			continue
		}
		s, err := d.reg.Lookup(ctx, id)
		if err != nil {
			return nil, err
		}
		found[id] = s
	}
	return func() {
		if len(d.known)+len(found) > maxKnown {
			clear(d.known)
		}
		maps.Copy(d.known, found)
	}, nil
}

// DecodeRecord parses rec.Value's framing, checks its schema and decodes
// the payload into rec.Event. Every error is an *event.Error (poison).
func (d *Decoder) DecodeRecord(rec *processor.Record) error {
	f, err := event.ParseFrame(rec.Value, d.format, d.format == event.FormatProtobuf)
	if err != nil {
		return err
	}
	s := d.known[f.SchemaID]
	if s == nil {
		// Missing said it was known: only a bug gets here. Refusing is
		// safer than guessing the schema.
		return poison(d.format, fmt.Sprintf("schema id %d was not looked up", f.SchemaID))
	}
	d.hits.Inc()
	if s.NotFound {
		return poison(d.format, fmt.Sprintf("schema id %d not found in the schema registry", f.SchemaID))
	}
	want := TypeProtobuf
	if d.format == event.FormatJSON {
		want = TypeJSON
	}
	if s.Type != want {
		return poison(d.format, fmt.Sprintf("schema id %d is a %s schema, the topic's format is %s", f.SchemaID, s.Type, d.format))
	}
	if want == TypeProtobuf {
		if why := s.checkEvent(f.MessageIndexes); why != "" {
			return poison(d.format, why)
		}
	}
	ev, err := d.inner.Decode(f.Payload)
	if err != nil {
		return err
	}
	rec.Event = ev
	return nil
}

func poison(format, reason string) *event.Error {
	return &event.Error{Kind: event.KindDecode, Format: format, Reason: reason}
}
