// Package otlp sets up the OpenTelemetry SDK that exports ratchet's spans
// with OTLP, configured the standard way, by the OTEL_* environment
// variables:
//
//   - OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT),
//     headers, timeout and TLS: read by the exporter itself;
//   - OTEL_EXPORTER_OTLP_PROTOCOL (or ..._TRACES_PROTOCOL): http/protobuf
//     (the default) or grpc;
//   - OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG: always_on,
//     always_off, traceidratio, parentbased_always_on (the default),
//     parentbased_always_off or parentbased_traceidratio, with a ratio from
//     0 to 1 (default 1);
//   - OTEL_SERVICE_NAME (default ratchet) and OTEL_RESOURCE_ATTRIBUTES;
//   - OTEL_BSP_*: the batch span processor's queue and delay.
//
// A value ratchet reads itself (protocol, sampler) that is not one of those
// is a configuration error naming the variable (exit code 2), found before
// anything is connected.
package otlp

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"ratchet/config"
)

// DefaultServiceName is service.name when OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES name none.
const DefaultServiceName = "ratchet"

// Protocols of OTEL_EXPORTER_OTLP_PROTOCOL that ratchet exports with.
const (
	ProtocolHTTP = "http/protobuf"
	ProtocolGRPC = "grpc"
)

// Settings are what ratchet reads of the OTEL_* variables itself.
type Settings struct {
	Protocol string
	Sampler  sdktrace.Sampler
	// SamplerName and Ratio describe Sampler, for the start log line.
	SamplerName string
	Ratio       float64
}

// Read reads the protocol and the sampler from getenv (os.Getenv, or a
// lookup in the environ list handed to the command), reporting every bad
// value at once as a *config.Error.
func Read(getenv func(string) string) (Settings, error) {
	var ps []config.Problem
	s := Settings{Protocol: ProtocolHTTP, SamplerName: "parentbased_always_on", Ratio: 1}
	protoVar := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	p := strings.TrimSpace(getenv(protoVar))
	if p == "" {
		protoVar = "OTEL_EXPORTER_OTLP_PROTOCOL"
		p = strings.TrimSpace(getenv(protoVar))
	}
	switch p {
	case "":
	case ProtocolHTTP, ProtocolGRPC:
		s.Protocol = p
	default:
		ps = append(ps, config.Problem{Env: protoVar, Value: p, Allowed: ProtocolHTTP + " or " + ProtocolGRPC})
	}
	if arg := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER_ARG")); arg != "" {
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || !(r >= 0 && r <= 1) {
			ps = append(ps, config.Problem{Env: "OTEL_TRACES_SAMPLER_ARG", Value: arg, Allowed: "a ratio from 0 to 1"})
		} else {
			s.Ratio = r
		}
	}
	if name := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER")); name != "" {
		s.SamplerName = name
	}
	switch s.SamplerName {
	case "always_on":
		s.Sampler = sdktrace.AlwaysSample()
	case "always_off":
		s.Sampler = sdktrace.NeverSample()
	case "traceidratio":
		s.Sampler = sdktrace.TraceIDRatioBased(s.Ratio)
	case "parentbased_always_on":
		s.Sampler = sdktrace.ParentBased(sdktrace.AlwaysSample())
	case "parentbased_always_off":
		s.Sampler = sdktrace.ParentBased(sdktrace.NeverSample())
	case "parentbased_traceidratio":
		s.Sampler = sdktrace.ParentBased(sdktrace.TraceIDRatioBased(s.Ratio))
	default:
		ps = append(ps, config.Problem{Env: "OTEL_TRACES_SAMPLER", Value: s.SamplerName,
			Allowed: "always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio"})
	}
	ps = append(ps, resourceAttributeProblems(getenv("OTEL_RESOURCE_ATTRIBUTES"))...)
	if len(ps) > 0 {
		return Settings{}, &config.Error{Problems: ps}
	}
	return s, nil
}

// resourceAttributeProblems checks OTEL_RESOURCE_ATTRIBUTES as the SDK
// parses it (comma-separated key=value, values percent-encoded): a pair
// without "=" made New fail with a plain error (exit 1, not a
// configuration error) and a bad escape made the SDK print a plain-text
// line to stderr, in the middle of a JSON log, and keep the raw value.
func resourceAttributeProblems(v string) []config.Problem {
	if strings.TrimSpace(v) == "" {
		return nil
	}
	var ps []config.Problem
	for _, pair := range strings.Split(v, ",") {
		k, val, found := strings.Cut(pair, "=")
		_, err := url.PathUnescape(strings.TrimSpace(val))
		if !found || strings.TrimSpace(k) == "" || err != nil {
			ps = append(ps, config.Problem{Env: "OTEL_RESOURCE_ATTRIBUTES", Value: pair,
				Allowed: "comma-separated key=value pairs, values percent-encoded"})
		}
	}
	return ps
}

// New builds a tracer provider exporting with OTLP per s. The exporter
// connects lazily: an unreachable collector costs dropped spans (the SDK
// reports them through otel's error handler, see LogErrors), never a
// failed start. Shut
// the provider down (with a deadline) to flush what is queued.
func New(ctx context.Context, s Settings) (*sdktrace.TracerProvider, error) {
	var exp *otlptrace.Exporter
	var err error
	switch s.Protocol {
	case ProtocolGRPC:
		exp, err = otlptracegrpc.New(ctx)
	default:
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("otlp trace exporter (%s): %w", s.Protocol, err)
	}
	// Later detectors win: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// override the default name.
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(DefaultServiceName)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(),
	)
	if err != nil {
		// The exporter is not handed to a provider: shut it down here,
		// or its client and connections outlive the failed start.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = exp.Shutdown(sctx)
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	return sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(s.Sampler),
	), nil
}

// errorEvery bounds how often LogErrors logs: an unreachable collector
// fails every export, every few seconds.
const errorEvery = time.Minute

// LogErrors sends the SDK's errors (failed exports, dropped spans) to log
// at warn level, at most one line per errorEvery with the count of those
// left out, instead of the standard library's logger, whose plain-text
// lines would break a JSON log. It sets the process-wide OpenTelemetry
// error handler.
func LogErrors(log *slog.Logger) {
	var mu sync.Mutex
	var last time.Time
	skipped := 0
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if !last.IsZero() && time.Since(last) < errorEvery {
			skipped++
			return
		}
		log.Warn("trace export failed; spans may be dropped", "err", err, "similar_errors_not_logged", skipped)
		last, skipped = time.Now(), 0
	}))
}
