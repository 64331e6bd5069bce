package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"ratchet/internal/testenv"
)

func TestBadConfigurationExitsTwoNamingTheKey(t *testing.T) {
	cases := []struct {
		name string
		env  []string
		key  string
	}{
		{"format", []string{"RATCHET_KAFKA_FORMAT=avro"}, "kafka.format"},
		{"batch size", []string{"RATCHET_PROCESSING_BATCH_SIZE=0"}, "processing.batch_size"},
		{"commit mode", []string{"RATCHET_COMMIT_MODE=sometimes"}, "commit.mode"},
		{"postgres url", []string{"RATCHET_POSTGRES_URL=http://db/x"}, "postgres.url"},
		{"linger", []string{"RATCHET_PROCESSING_BATCH_LINGER=forever"}, "processing.batch_linger"},
		{"max attempts", []string{"RATCHET_RETRY_MAX_ATTEMPTS=0"}, "retry.max_attempts"},
		{"http addr", []string{"RATCHET_HTTP_ADDR=:99999"}, "http.addr"},
		{"unknown variable", []string{"RATCHET_COMMIT_INTERVALL=1s"}, "RATCHET_COMMIT_INTERVALL"},
		{"dashboard on raw", []string{"RATCHET_KAFKA_FORMAT=raw"}, `kafka.format: "raw" is not allowed (allowed: protobuf or json: the dashboard processor reads ratchet.v1.Event`},
		{"dashboard on a raw topic", []string{"RATCHET_KAFKA_TOPICS=a,b", "RATCHET_KAFKA_TOPIC_FORMATS=b=raw"}, `kafka.topic_formats.b: "raw" is not allowed`},
		{"registry url", []string{"RATCHET_SCHEMA_REGISTRY_URL=registry:8081"}, "schema_registry.url (RATCHET_SCHEMA_REGISTRY_URL)"},
		{"tracing switch", []string{"RATCHET_TRACING_ENABLED=yes"}, `tracing.enabled (RATCHET_TRACING_ENABLED): "yes" is not allowed (allowed: true or false)`},
		{"trace protocol", []string{"RATCHET_TRACING_ENABLED=true", "OTEL_EXPORTER_OTLP_PROTOCOL=http/json"}, `OTEL_EXPORTER_OTLP_PROTOCOL: "http/json" is not allowed`},
		{"trace sampler", []string{"RATCHET_TRACING_ENABLED=true", "OTEL_TRACES_SAMPLER=half"}, `OTEL_TRACES_SAMPLER: "half" is not allowed`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			// Brokers and database point nowhere: the run must stop before
			// it tries to connect.
			env := append([]string{"RATCHET_KAFKA_BROKERS=127.0.0.1:1", "RATCHET_POSTGRES_URL=postgres://127.0.0.1:1/x"}, tc.env...)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			code := Run(ctx, []string{"run"}, env, &out, &errOut)
			if code != ExitConfig {
				t.Fatalf("exit code %d, want %d; stderr: %s", code, ExitConfig, errOut.String())
			}
			if !strings.Contains(errOut.String(), tc.key) {
				t.Errorf("stderr does not name %s: %s", tc.key, errOut.String())
			}
			for _, line := range strings.Split(strings.TrimSpace(errOut.String()), "\n") {
				if !strings.HasPrefix(line, "ratchet: config: ") {
					t.Errorf("unexpected line (nothing else may run): %q", line)
				}
			}
		})
	}
}

func TestUsageErrorsExitTwo(t *testing.T) {
	for _, args := range [][]string{{}, {"frobnicate"}, {"run", "--no-such-flag"}, {"broker", "-partitions", "0"}, {"produce", "-poison", "2"}} {
		var out, errOut bytes.Buffer
		if code := Run(context.Background(), args, nil, &out, &errOut); code != ExitConfig {
			t.Errorf("%v: exit %d, want %d (%s)", args, code, ExitConfig, errOut.String())
		}
	}
}

func TestVersion(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := Run(context.Background(), []string{"version"}, nil, &out, &errOut); code != ExitOK {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if !strings.HasPrefix(out.String(), "ratchet ") || !strings.Contains(out.String(), "librdkafka") {
		t.Errorf("version output %q", out.String())
	}
}

// TestDevServesAPageWithEventsFlowing runs `ratchet dev` as `make run` does
// and reads its page and JSON until records are applied and charted.
func TestDevServesAPageWithEventsFlowing(t *testing.T) {
	dbURL := testenv.Postgres(t)
	var out, errOut testenv.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"dev", "-rate", "300"}, []string{
			"RATCHET_POSTGRES_URL=" + dbURL, "RATCHET_HTTP_ADDR=127.0.0.1:0", "RATCHET_COMMIT_INTERVAL=200ms",
		}, &out, &errOut)
	}()
	defer func() {
		cancel()
		select {
		case code := <-done:
			if code != ExitOK {
				t.Errorf("dev exited %d; stderr tail: %s", code, tail(errOut.String()))
			}
		case <-time.After(60 * time.Second):
			t.Error("dev did not stop within 60s")
		}
	}()
	re := regexp.MustCompile(`open (http://127\.0\.0\.1:\d+/)`)
	var url string
	testenv.Eventually(t, 60*time.Second, func() bool {
		m := re.FindStringSubmatch(out.String())
		if m != nil {
			url = m[1]
		}
		return m != nil
	}, "dev prints the page URL; stderr: %s", tail(errOut.String()))

	type state struct {
		Pipeline struct {
			Partitions []struct {
				Records   int64 `json:"records"`
				Committed int64 `json:"committed_offset"`
			} `json:"partitions"`
		} `json:"pipeline"`
		Rollups []struct {
			Count int64 `json:"count"`
		} `json:"rollups"`
	}
	read := func() (records, rolled int64, parts int) {
		resp, err := http.Get(url + "api/state")
		if err != nil {
			return 0, 0, 0
		}
		defer resp.Body.Close()
		var s state
		if json.NewDecoder(resp.Body).Decode(&s) != nil {
			return 0, 0, 0
		}
		for _, p := range s.Pipeline.Partitions {
			records += p.Records
		}
		for _, r := range s.Rollups {
			rolled += r.Count
		}
		return records, rolled, len(s.Pipeline.Partitions)
	}
	var first int64
	testenv.Eventually(t, 60*time.Second, func() bool {
		r, rolled, parts := read()
		first = r
		return r > 0 && rolled > 0 && parts == 12
	}, "page shows 12 partitions with records and rollups")
	testenv.Eventually(t, 60*time.Second, func() bool {
		r, _, _ := read()
		return r > first
	}, "records keep flowing")

	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "<html") {
		t.Errorf("page: %d %.200s", resp.StatusCode, body)
	}
}

func tail(s string) string {
	if len(s) > 2000 {
		return s[len(s)-2000:]
	}
	return s
}
