package kafkaclient_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/internal/kafkaclient"
	"ratchet/internal/testenv"
)

// TestLogLevel: librdkafka's lines keep their syslog level's weight,
// except connection failures (warn, librdkafka reconnects) and the
// information lines that say nothing to an operator (debug); a warning or
// an error is never quietened, whatever its tag or text.
func TestLogLevel(t *testing.T) {
	const telemetry = "[thrd:main]: Telemetry client instance id changed from AAAAAAAAAAAAAAAAAAAAAA to nbOAS6eQxqWVkJOOoBiF1Q"
	tests := []struct {
		name string
		ev   kafka.LogEvent
		want slog.Level
	}{
		{"telemetry id at every start", kafka.LogEvent{Level: 6, Tag: "GETSUBSCRIPTIONS", Message: telemetry}, slog.LevelDebug},
		{"telemetry id under another tag", kafka.LogEvent{Level: 6, Tag: "TELEMETRY", Message: telemetry}, slog.LevelDebug},
		{"telemetry push", kafka.LogEvent{Level: 5, Tag: "PUSHTELEMETRY", Message: "[thrd:main]: pushing metrics"}, slog.LevelDebug},
		{"partition count change", kafka.LogEvent{Level: 5, Tag: "PARTCNT", Message: "Topic events partition count changed from 4 to 8"}, slog.LevelInfo},
		{"other information", kafka.LogEvent{Level: 6, Tag: "CGRPSTATE", Message: "Group \"g\" changed state"}, slog.LevelInfo},
		{"telemetry warning stays", kafka.LogEvent{Level: 4, Tag: "GETSUBSCRIPTIONS", Message: "Telemetry client instance id changed; push failed"}, slog.LevelWarn},
		{"telemetry error stays", kafka.LogEvent{Level: 3, Tag: "TELEMETRY", Message: "Telemetry: cannot encode metrics"}, slog.LevelError},
		{"configuration warning", kafka.LogEvent{Level: 4, Tag: "CONFWARN", Message: "Configuration property x is a consumer property"}, slog.LevelWarn},
		{"max poll exceeded", kafka.LogEvent{Level: 4, Tag: "MAXPOLL", Message: "Application maximum poll interval exceeded"}, slog.LevelWarn},
		{"connection refused", kafka.LogEvent{Level: 3, Tag: "FAIL", Message: "Connect to ipv4#127.0.0.1:1 failed: Connection refused"}, slog.LevelWarn},
		{"transport error", kafka.LogEvent{Level: 3, Tag: "ERROR", Message: "1/1 brokers are down"}, slog.LevelWarn},
		{"ssl error", kafka.LogEvent{Level: 3, Tag: "SSL", Message: "certificate verify failed"}, slog.LevelError},
		{"fatal", kafka.LogEvent{Level: 0, Tag: "FATAL", Message: "Fatal error: Broker: Static consumer fenced"}, slog.LevelError},
		{"debug", kafka.LogEvent{Level: 7, Tag: "FETCH", Message: "Fetch topic events [0] at offset 10"}, slog.LevelDebug},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := kafkaclient.LogLevel(tt.ev); got != tt.want {
				t.Errorf("LogLevel(%d %s %q) = %v, want %v", tt.ev.Level, tt.ev.Tag, tt.ev.Message, got, tt.want)
			}
		})
	}
}

// TestStartLogsNothingAtInfo: a producer and a consumer started against
// a broker log the telemetry line librdkafka writes at every start, and
// ratchet's log has it at debug: nothing of a normal start reaches info.
func TestStartLogsNothingAtInfo(t *testing.T) {
	_, addr := testenv.Kafka(t, 1, "events")
	rec := testenv.NewLogRecorder(slog.LevelDebug)
	p, err := kafkaclient.NewProducer([]string{addr}, nil, rec.Logger())
	if err != nil {
		t.Fatal(err)
	}
	c, err := kafkaclient.NewConsumer(kafkaclient.ConsumerOptions{Brokers: []string{addr}, GroupID: "g"}, rec.Logger())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SubscribeTopics([]string{"events"}, nil); err != nil {
		t.Fatal(err)
	}
	telemetry := func(client string) func() bool {
		return func() bool {
			for _, l := range rec.Lines("librdkafka") {
				if l.Attrs["client"] == client && strings.Contains(l.Attrs["message"].(string), "Telemetry client instance id changed") {
					return true
				}
			}
			return false
		}
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		c.Poll(100)
		return telemetry("producer")() && telemetry("consumer")()
	}, "both clients log the telemetry instance id")
	c.Close()
	p.Close()
	for _, l := range rec.Lines("librdkafka") {
		if strings.Contains(l.Attrs["message"].(string), "Telemetry") && l.Level != slog.LevelDebug {
			t.Errorf("%v at %v, want debug", l.Attrs, l.Level)
		}
		if l.Level >= slog.LevelInfo {
			t.Errorf("a normal start logged %v at %v", l.Attrs, l.Level)
		}
	}
}
