package produce

import (
	"fmt"
	"math/rand/v2"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"ratchet/internal/event"
	ratchetv1 "ratchet/messages/ratchet/v1"
)

// DefaultMetrics are the metric names generated when Options.Metrics is
// empty.
var DefaultMetrics = []string{"page_view", "signup", "checkout", "api_latency_ms", "error"}

// Regions are the values of the "region" label of generated events.
var Regions = []string{"eu-west", "eu-central", "us-east", "us-west", "ap-south"}

// PoisonKind says how a poison record is broken. The Generator cycles
// through the kinds in the order below.
type PoisonKind string

const (
	// PoisonGarbage is bytes that are neither protobuf nor JSON.
	PoisonGarbage PoisonKind = "garbage"
	// PoisonWrongFormat is a valid event in the other encoding: JSON text
	// where protobuf is expected, protobuf bytes where JSON is expected.
	PoisonWrongFormat PoisonKind = "wrong-format"
	// PoisonMissingField is a well-formed message in the right encoding that
	// lacks a required field: every other one has no metric, the others no
	// time.
	PoisonMissingField PoisonKind = "missing-field"
)

var poisonKinds = [...]PoisonKind{PoisonGarbage, PoisonWrongFormat, PoisonMissingField}

// garbage fails proto.Unmarshal: ten 0xff bytes are a varint tag longer than
// 64 bits. It is not valid UTF-8 either, so it is no JSON.
var garbage = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 'p', 'o', 'i', 's', 'o', 'n'}

// Generator produces a deterministic sequence of records for a given
// Options.Seed, Options.PoisonFraction, Options.Format, Options.Metrics,
// Options.TimeSpread and event-time clock (Options.Now). Two Generators built
// from equal Options return equal keys and events, so a test can compute the
// expected rollups of a run on its own. A Generator is not safe for
// concurrent use.
type Generator struct {
	rng        *rand.Rand
	format     string
	metrics    []string
	poison     float64
	spread     time.Duration
	now        func() time.Time
	seed       int64
	seq        int64
	poisonSeen int64
	lastKind   PoisonKind
	marshal    proto.MarshalOptions
}

// NewGenerator returns a Generator for opts. Only the fields that shape
// records are used; an unknown Format counts as protobuf (Run validates it).
func NewGenerator(opts Options) *Generator {
	metrics := opts.Metrics
	if len(metrics) == 0 {
		metrics = DefaultMetrics
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	return &Generator{
		rng:     rand.New(rand.NewPCG(uint64(opts.Seed), 0x9e3779b97f4a7c15)),
		format:  opts.Format,
		metrics: metrics,
		poison:  opts.PoisonFraction,
		spread:  opts.TimeSpread,
		now:     now,
		seed:    opts.Seed,
		marshal: proto.MarshalOptions{Deterministic: true},
	}
}

// Next returns the next record. key is the event id (poison records get an
// id too, from the same sequence). For a good record ev is the event encoded
// in value and poison is false; for a poison record ev is nil, poison is
// true and LastPoisonKind says how it is broken.
//
// Values are multiples of 0.25 (integers, fractions, sometimes negative), so
// sums of them are exact in float64 whatever the order of addition. Event
// times are the clock's now minus a uniform offset in [0, TimeSpread],
// truncated to the millisecond.
func (g *Generator) Next() (key, value []byte, ev *ratchetv1.Event, poison bool) {
	g.seq++
	id := fmt.Sprintf("s%d-%09d", g.seed, g.seq)
	isPoison := g.poison > 0 && g.rng.Float64() < g.poison
	e := g.event(id)
	if !isPoison {
		g.lastKind = ""
		return []byte(id), g.encode(e, g.format), e, false
	}
	kind := poisonKinds[g.poisonSeen%int64(len(poisonKinds))]
	g.lastKind = kind
	switch kind {
	case PoisonGarbage:
		value = append([]byte(nil), garbage...)
	case PoisonWrongFormat:
		other := event.FormatJSON
		if g.format == event.FormatJSON {
			other = event.FormatProtobuf
		}
		value = g.encode(e, other)
	case PoisonMissingField:
		if (g.poisonSeen/int64(len(poisonKinds)))%2 == 0 {
			e.Metric = ""
		} else {
			e.Time = nil
		}
		value = g.encode(e, g.format)
	}
	g.poisonSeen++
	return []byte(id), value, nil, true
}

// LastPoisonKind returns how the record last returned by Next is broken, or
// "" when it was a good record.
func (g *Generator) LastPoisonKind() PoisonKind { return g.lastKind }

func (g *Generator) event(id string) *ratchetv1.Event {
	metric := g.metrics[g.rng.IntN(len(g.metrics))]
	t := g.now()
	if g.spread > 0 {
		t = t.Add(-time.Duration(g.rng.Int64N(int64(g.spread) + 1)))
	}
	t = t.Truncate(time.Millisecond)
	return &ratchetv1.Event{
		Id:     id,
		Metric: metric,
		Value:  g.value(metric),
		Time:   timestamppb.New(t),
		Labels: map[string]string{"region": Regions[g.rng.IntN(len(Regions))]},
	}
}

// value draws a plausible value for metric, always a multiple of 0.25.
func (g *Generator) value(metric string) float64 {
	switch metric {
	case "page_view", "signup", "error":
		return 1
	case "checkout":
		// An amount from 1.00 to 500.00 in quarter steps; one in ten is a
		// refund.
		v := float64(g.rng.IntN(1997)+4) / 4
		if g.rng.IntN(10) == 0 {
			v = -v
		}
		return v
	case "api_latency_ms":
		// 1 to 1500 ms, in half milliseconds.
		return float64(g.rng.IntN(2999)+2) / 2
	default:
		// -250 to 750 in quarter steps.
		return float64(g.rng.IntN(4001)-1000) / 4
	}
}

func (g *Generator) encode(e *ratchetv1.Event, format string) []byte {
	var (
		b   []byte
		err error
	)
	if format == event.FormatJSON {
		b, err = protojson.Marshal(e)
	} else {
		b, err = g.marshal.Marshal(e)
	}
	if err != nil {
		// Only a non-UTF-8 string can make either fail, and every string
		// here is built from UTF-8 constants.
		panic(fmt.Sprintf("encode event %s: %v", e.Id, err))
	}
	return b
}
