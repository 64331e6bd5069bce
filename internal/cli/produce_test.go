package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry"
	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry/serde"
	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry/serde/protobuf"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/encoding/protojson"

	"ratchet/internal/event"
	"ratchet/internal/testenv"
	ratchetv1 "ratchet/messages/ratchet/v1"
)

// readTopic reads n records of topic from the start.
func readTopic(tb testing.TB, addr, topic string, n int) []*kafka.Message {
	tb.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": addr, "group.id": "reader", "log_level": 3})
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	if err := c.Assign([]kafka.TopicPartition{{Topic: &topic, Partition: 0, Offset: kafka.OffsetBeginning}}); err != nil {
		tb.Fatal(err)
	}
	var out []*kafka.Message
	deadline := time.Now().Add(60 * time.Second)
	for len(out) < n && time.Now().Before(deadline) {
		if m, err := c.ReadMessage(time.Second); err == nil {
			out = append(out, m)
		}
	}
	if len(out) < n {
		tb.Fatalf("read %d of %d records", len(out), n)
	}
	return out
}

// TestProduceWithSchemaRegistry: `ratchet produce --schema-registry`
// registers the event schema and writes records Confluent's own
// deserializer reads back.
func TestProduceWithSchemaRegistry(t *testing.T) {
	for _, format := range []string{"protobuf", "json"} {
		t.Run(format, func(t *testing.T) {
			_, addr := testenv.Kafka(t, 1, "events")
			reg := testenv.NewRegistry(t, "", "")
			var out, errOut bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			code := Run(ctx, []string{"produce", "--schema-registry", reg.URL(), "--count", "20", "--rate", "0",
				"--format", format}, []string{"RATCHET_KAFKA_BROKERS=" + addr}, &out, &errOut)
			if code != ExitOK {
				t.Fatalf("exit %d: %s", code, errOut.String())
			}
			if !strings.Contains(errOut.String(), "event schema registered") {
				t.Errorf("log does not say the schema was registered: %s", errOut.String())
			}
			msgs := readTopic(t, addr, "events", 20)
			client, err := schemaregistry.NewClient(schemaregistry.NewConfig(reg.URL()))
			if err != nil {
				t.Fatal(err)
			}
			des, err := protobuf.NewDeserializer(client, serde.ValueSerde, protobuf.NewDeserializerConfig())
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range msgs {
				var ev ratchetv1.Event
				if format == "protobuf" {
					if err := des.DeserializeInto("events", m.Value, &ev); err != nil {
						t.Fatalf("Confluent's deserializer refuses %x: %v", m.Value, err)
					}
				} else {
					f, err := event.ParseFrame(m.Value, format, false)
					if err != nil {
						t.Fatal(err)
					}
					info, err := client.GetBySubjectAndID("", int(f.SchemaID))
					if err != nil || info.SchemaType != "JSON" {
						t.Fatalf("schema %d: %+v %v", f.SchemaID, info, err)
					}
					if err := protojson.Unmarshal(f.Payload, &ev); err != nil {
						t.Fatal(err)
					}
				}
				if event.Validate(&ev) != nil {
					t.Errorf("record %d is not a valid event: %v", m.TopicPartition.Offset, &ev)
				}
			}
		})
	}
}

// TestRunWithSchemaRegistry is the documented path end to end through the
// command line: `ratchet produce --schema-registry` writes framed records,
// `ratchet run` with RATCHET_SCHEMA_REGISTRY_URL (basic auth from the
// environment) applies every one of them to the dashboard.
func TestRunWithSchemaRegistry(t *testing.T) {
	_, addr := testenv.Kafka(t, 2, "events")
	dbURL := testenv.Postgres(t)
	reg := testenv.NewRegistry(t, "key", "s3cret")
	env := []string{"RATCHET_KAFKA_BROKERS=" + addr, "RATCHET_POSTGRES_URL=" + dbURL, "RATCHET_HTTP_ADDR=127.0.0.1:0",
		"RATCHET_SCHEMA_REGISTRY_URL=" + reg.URL(), "RATCHET_SCHEMA_REGISTRY_USERNAME=key", "RATCHET_SCHEMA_REGISTRY_PASSWORD=s3cret"}
	var pout, perr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if code := Run(ctx, []string{"produce", "--count", "300", "--rate", "0", "--poison", "0"}, env, &pout, &perr); code != ExitOK {
		t.Fatalf("produce exited %d: %s", code, perr.String())
	}

	var out, errOut testenv.Buffer
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- Run(runCtx, []string{"run"}, env, &out, &errOut) }() // ends when runCtx is cancelled
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	testenv.Eventually(t, 90*time.Second, func() bool {
		var n int64
		err := pool.QueryRow(context.Background(), `SELECT coalesce(sum(count), 0) FROM dashboard_rollups`).Scan(&n)
		return err == nil && n == 300
	}, "300 events in dashboard_rollups; stderr: %s", tail(errOut.String()))
	stop()
	select {
	case code := <-done:
		if code != ExitOK {
			t.Errorf("run exited %d: %s", code, tail(errOut.String()))
		}
	case <-time.After(60 * time.Second):
		t.Fatal("run did not stop within 60s")
	}
	if strings.Contains(errOut.String()+perr.String(), "s3cret") {
		t.Error("the registry password appears in the logs")
	}
	if !strings.Contains(errOut.String(), `"username":"REDACTED","password":"REDACTED"`) {
		t.Errorf("the logged configuration does not show the password as REDACTED: %s", tail(errOut.String()))
	}
}
