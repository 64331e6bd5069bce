package otlp

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"

	"ratchet/config"
)

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

func TestRead(t *testing.T) {
	for _, tc := range []struct {
		name         string
		getenv       func(string) string
		wantProtocol string
		wantSampler  string
		wantRatio    float64
		wantErr      []string // one line per problem, naming the variable
	}{
		{"defaults", env(), ProtocolHTTP, "parentbased_always_on", 1, nil},
		{"grpc", env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"), ProtocolGRPC, "parentbased_always_on", 1, nil},
		{"traces protocol wins", env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"), ProtocolHTTP, "parentbased_always_on", 1, nil},
		{"ratio", env("OTEL_TRACES_SAMPLER", "traceidratio", "OTEL_TRACES_SAMPLER_ARG", "0.01"), ProtocolHTTP, "traceidratio", 0.01, nil},
		{"bad protocol", env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"), "", "", 0,
			[]string{`OTEL_EXPORTER_OTLP_PROTOCOL: "http/json" is not allowed (allowed: http/protobuf or grpc)`}},
		{"bad sampler and ratio", env("OTEL_TRACES_SAMPLER", "sometimes", "OTEL_TRACES_SAMPLER_ARG", "2"), "", "", 0,
			[]string{`OTEL_TRACES_SAMPLER_ARG: "2" is not allowed (allowed: a ratio from 0 to 1)`, `OTEL_TRACES_SAMPLER: "sometimes" is not allowed`}},
		{"resource attributes", env("OTEL_RESOURCE_ATTRIBUTES", "service.namespace=shop, deployment.environment=prod%20eu"),
			ProtocolHTTP, "parentbased_always_on", 1, nil},
		{"bad resource attributes", env("OTEL_RESOURCE_ATTRIBUTES", "team=a,foo,bar=%zz,=x"), "", "", 0,
			[]string{`OTEL_RESOURCE_ATTRIBUTES: "foo" is not allowed`, `OTEL_RESOURCE_ATTRIBUTES: "bar=%zz" is not allowed`,
				`OTEL_RESOURCE_ATTRIBUTES: "=x" is not allowed`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Read(tc.getenv)
			if tc.wantErr != nil {
				var ce *config.Error
				if !errors.As(err, &ce) {
					t.Fatalf("error %v, want a *config.Error (exit code 2)", err)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Protocol != tc.wantProtocol || s.SamplerName != tc.wantSampler || s.Ratio != tc.wantRatio || s.Sampler == nil {
				t.Errorf("settings %+v, want %s %s %v", s, tc.wantProtocol, tc.wantSampler, tc.wantRatio)
			}
		})
	}
}

// TestLogErrorsLogsOncePerInterval: the SDK's errors reach the log as one
// warn line, then nothing for a while, however often exports fail.
func TestLogErrorsLogsOncePerInterval(t *testing.T) {
	var buf bytes.Buffer
	LogErrors(slog.New(slog.NewJSONHandler(&buf, nil)))
	for range 5 {
		otel.Handle(errors.New("connection refused"))
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], `"level":"WARN"`) || !strings.Contains(lines[0], "connection refused") {
		t.Errorf("log %q, want one warn line naming the error", buf.String())
	}
}

// TestShutdownEndsByItsDeadline: with no collector listening, either
// protocol's provider starts (the exporter connects lazily) and its
// shutdown, which flushes the queued spans, returns by the deadline it is
// given: the stop's deadline bounds it.
func TestShutdownEndsByItsDeadline(t *testing.T) {
	for _, protocol := range []string{ProtocolHTTP, ProtocolGRPC} {
		t.Run(protocol, func(t *testing.T) {
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
			s, err := Read(env("OTEL_EXPORTER_OTLP_PROTOCOL", protocol, "OTEL_TRACES_SAMPLER", "always_on"))
			if err != nil {
				t.Fatal(err)
			}
			tp, err := New(t.Context(), s)
			if err != nil {
				t.Fatalf("new %s provider: %v", protocol, err)
			}
			_, span := tp.Tracer("test").Start(t.Context(), "x")
			span.End()
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			began := time.Now()
			_ = tp.Shutdown(ctx) // the export fails: nobody listens
			if took := time.Since(began); took > 3*time.Second {
				t.Errorf("shutdown took %s with a 500ms deadline", took)
			}
		})
	}
}
