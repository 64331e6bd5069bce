package cli

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"ratchet/config"
	"ratchet/internal/tracing"
	"ratchet/internal/tracing/otlp"
)

// tracerFlush bounds the export of what a command's spans left queued
// when it ends.
const tracerFlush = 10 * time.Second

// startTracer sets up tracing for a command other than the engine
// (`ratchet produce`, `ratchet dlq replay`) when tracing.enabled: spans go
// to the OTLP exporter the OTEL_* variables configure. It returns nil and
// a stop that does nothing when tracing is off. stop flushes the spans,
// within tracerFlush.
func startTracer(e *env, cfg config.Config, log *slog.Logger) (*tracing.Tracer, func(), error) {
	if !cfg.Tracing.Enabled {
		return nil, func() {}, nil
	}
	s, err := otlp.Read(e.getenv)
	if err != nil {
		return nil, nil, err
	}
	tp, err := otlp.New(context.Background(), s)
	if err != nil {
		return nil, nil, err
	}
	otlp.LogErrors(log)
	log.Info("tracing on", "protocol", s.Protocol, "sampler", s.SamplerName, "ratio", s.Ratio)
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), tracerFlush)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			log.Warn("trace export did not finish", "err", err)
		}
	}
	return tracing.New(tp, tracing.Options{Group: cfg.Kafka.GroupID}), stop, nil
}

// getenv looks name up in the command's environment; the last of several
// wins, as with os.Getenv.
func (e *env) getenv(name string) string {
	v := ""
	for _, kv := range e.environ {
		if k, val, ok := strings.Cut(kv, "="); ok && k == name {
			v = val
		}
	}
	return v
}
