package engine

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"ratchet/actors"
	"ratchet/config"
	"ratchet/internal/event"
	"ratchet/internal/metrics"
	"ratchet/internal/schemareg"
	"ratchet/internal/tracing/otlp"
	"ratchet/processor"
	"ratchet/processor/dashboard"
	"ratchet/processor/pipeline"
)

// Check reports, as a *config.Error (exit code 2), what makes cfg unusable
// with opts before anything connects: cfg.Validate's problems, and a topic
// whose format decodes no event (raw) for a processor that reads only
// events (the dashboard, the default). Run checks the same; commands call
// Check first to refuse before they log or start anything.
func Check(cfg config.Config, opts Options) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if len(cfg.Pipelines) > 0 {
		_, err := compilePipelines(cfg, opts)
		return err
	}
	if opts.Processor == nil {
		opts.Processor = dashboard.New()
	}
	if err := checkFormats(cfg, opts); err != nil {
		return err
	}
	if cfg.Tracing.Enabled && opts.TracerProvider == nil {
		if _, err := otlp.Read(opts.getenv()); err != nil {
			return err
		}
	}
	return nil
}

// checkFormats refuses, as a configuration error (exit code 2), a topic
// whose format decodes no event when the processor reads only events.
func checkFormats(cfg config.Config, opts Options) error {
	if opts.Decoder != nil {
		return nil // the custom decoder decides what the processor gets
	}
	er, ok := opts.Processor.(processor.EventReader)
	if !ok || !er.ReadsEvents() {
		return nil
	}
	allowed := fmt.Sprintf("protobuf or json: the %s processor reads ratchet.v1.Event (raw is for custom processors)", opts.Processor.Name())
	var ps []config.Problem
	if cfg.Kafka.Format == event.FormatRaw {
		ps = append(ps, config.Problem{Key: "kafka.format", Value: event.FormatRaw, Allowed: allowed})
	}
	for _, t := range cfg.Kafka.Topics {
		if f, ok := cfg.Kafka.TopicFormats[t]; ok && f == event.FormatRaw {
			ps = append(ps, config.Problem{Key: "kafka.topic_formats." + t, Value: event.FormatRaw, Allowed: allowed})
		}
	}
	if len(ps) > 0 {
		return &config.Error{Problems: ps}
	}
	return nil
}

// newDecoders returns the partition decoder factory: for a topic read by
// configured pipelines, their format (json: any document; avro and
// protobuf: any schema from the registry; event: as below, tombstones let
// through); otherwise the custom decoder of opts when set, or per topic
// raw, the event formats, or, with schema_registry.url, the event formats
// in the registry's wire format. Every decoder counts what it decodes in
// ratchet_decoded_records_total.
func newDecoders(cfg config.Config, opts Options, pipelines *pipeline.Set, m *metrics.Metrics) (func(topic string) actors.ValueDecoder, error) {
	var reg *schemareg.Registry
	if cfg.SchemaRegistry.URL != "" && opts.Decoder == nil {
		var err error
		if reg, err = schemareg.New(cfg.SchemaRegistry, m); err != nil {
			return nil, err
		}
	}
	decoder := func(topic string) actors.ValueDecoder {
		format := cfg.FormatFor(topic)
		pformat, piped := "", false
		if pipelines != nil {
			pformat, piped = pipelines.Format(topic)
		}
		switch {
		case piped && pformat == config.PipelineJSON:
			framed := cfg.SchemaRegistry.URL != ""
			return &counted{dec: pipelines.JSONDecoder(topic, framed), counts: newCounts(m, topic, "json-any")}
		case piped && reg != nil && (pformat == config.PipelineAvro || pformat == config.PipelineProtobuf):
			typ := schemareg.TypeAvro
			if pformat == config.PipelineProtobuf {
				typ = schemareg.TypeProtobuf
			}
			d := schemareg.NewValueDecoder(reg, typ, m)
			if paths, ok := pipelines.ReadPaths(topic); ok {
				d.ReadOnly(paths) // build only what the pipelines read, as for json
			}
			return &countedValueResolver{ValueDecoder: d, counts: newCounts(m, topic, pformat+"+registry")}
		case opts.Decoder != nil:
			return &counted{dec: custom{opts.Decoder}, counts: newCounts(m, topic, "custom")}
		case format == event.FormatRaw:
			return &counted{dec: event.NewDecoder(event.FormatRaw), counts: newCounts(m, topic, format)}
		case reg != nil:
			d := schemareg.NewDecoder(reg, format, m)
			return &countedResolver{Decoder: d, counts: newCounts(m, topic, format+"+registry")}
		default:
			return &counted{dec: event.NewDecoder(format), counts: newCounts(m, topic, format)}
		}
	}
	return func(topic string) actors.ValueDecoder {
		d := decoder(topic)
		if pipelines != nil {
			if f, ok := pipelines.Format(topic); ok && f == config.PipelineEvent {
				d = passTombstones(d)
			}
		}
		return skipReplaysOfOtherGroups(d, cfg.Kafka.GroupID, m.ReplaysSkipped.WithLabelValues(topic))
	}, nil
}

// counts are one topic's and format's decode counters, looked up once.
type counts struct{ ok, poison prometheus.Counter }

func newCounts(m *metrics.Metrics, topic, format string) counts {
	return counts{ok: m.DecodedRecords.WithLabelValues(topic, format, "ok"),
		poison: m.DecodedRecords.WithLabelValues(topic, format, "poison")}
}

func (c counts) count(err error) error {
	if err != nil {
		c.poison.Inc()
	} else {
		c.ok.Inc()
	}
	return err
}

// counted counts the records of a decoder.
type counted struct {
	dec actors.ValueDecoder
	counts
}

func (c *counted) DecodeRecord(rec *processor.Record) error { return c.count(c.dec.DecodeRecord(rec)) }

// countedResolver counts the records of a schema registry decoder and
// keeps it an actors.Resolver.
type countedResolver struct {
	*schemareg.Decoder
	counts
}

func (c *countedResolver) DecodeRecord(rec *processor.Record) error {
	return c.count(c.Decoder.DecodeRecord(rec))
}

// countedValueResolver counts the records of a pipeline's registry
// decoder and keeps it an actors.Resolver.
type countedValueResolver struct {
	*schemareg.ValueDecoder
	counts
}

func (c *countedValueResolver) DecodeRecord(rec *processor.Record) error {
	return c.count(c.ValueDecoder.DecodeRecord(rec))
}

// passTombstones lets a null value (a tombstone) through dec undecoded:
// the event formats would refuse it as poison, but a pipeline of format
// event may delete on it. A Resolver stays one.
func passTombstones(dec actors.ValueDecoder) actors.ValueDecoder {
	t := tombstones{dec}
	if r, ok := dec.(actors.Resolver); ok {
		return tombstonesResolver{tombstones: t, Resolver: r}
	}
	return t
}

type tombstones struct{ actors.ValueDecoder }

func (t tombstones) DecodeRecord(rec *processor.Record) error {
	if rec.Value == nil {
		return nil
	}
	return t.ValueDecoder.DecodeRecord(rec)
}

type tombstonesResolver struct {
	tombstones
	actors.Resolver
}

// custom adapts a processor.Decoder; every error it returns is poison.
type custom struct{ d processor.Decoder }

func (c custom) DecodeRecord(rec *processor.Record) error {
	if err := c.d.Decode(rec); err != nil {
		return fmt.Errorf("custom decoder: %w", err)
	}
	return nil
}
