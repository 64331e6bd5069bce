package engine_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"ratchet/config"
	"ratchet/engine"
)

// syncBuffer is a log destination safe for the engine's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Rollups under commit.mode at-least-once count a replayed record twice:
// the engine says so once when it starts, naming the rollups; not under
// exactly-once.
func TestAtLeastOnceRollupsWarnOnce(t *testing.T) {
	const warning = "rollup pipelines with commit.mode at-least-once: records replayed after a crash are counted twice"
	for _, tc := range []struct {
		mode string
		want int
	}{{config.ModeAtLeastOnce, 1}, {config.ModeExactlyOnce, 0}} {
		t.Run(tc.mode, func(t *testing.T) {
			// Nothing is listening there: the engine is stopped before it
			// connects (ctx is done), after it has said what it warns of.
			cfg := testConfig(t, "127.0.0.1:1", "postgres://127.0.0.1:1/none", tc.mode)
			cfg.Pipelines = append(orderPipelines(), config.Pipeline{Name: "order_log", Topic: topic, Format: config.PipelineJSON,
				Append: &config.Append{Table: "order_log", Columns: []config.Column{{Name: "id", Expr: "string(record.key)"}}}})
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			var logs syncBuffer
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			err := engine.Run(ctx, cfg, engine.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			out := logs.String()
			if got := strings.Count(out, warning); got != tc.want {
				t.Fatalf("%d warnings, want %d:\n%s", got, tc.want, out)
			}
			if tc.want > 0 && !strings.Contains(out, "pipelines=[revenue_per_minute]") {
				t.Fatalf("the warning does not name the rollup:\n%s", out)
			}
			// An append's replayed records are appended again.
			const appended = "append pipelines with commit.mode at-least-once: records replayed after a crash are appended twice"
			if got := strings.Count(out, appended); got != tc.want || (tc.want > 0 && !strings.Contains(out, "pipelines=[order_log]")) {
				t.Fatalf("%d warnings of appends, want %d naming order_log:\n%s", got, tc.want, out)
			}
		})
	}
}
