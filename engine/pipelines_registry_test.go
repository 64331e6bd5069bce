package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry"
	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry/serde"
	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry/serde/avrov2"
	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry/serde/jsonschema"
	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry/serde/protobuf"
	"google.golang.org/protobuf/types/known/timestamppb"

	"ratchet/config"
	"ratchet/internal/event"
	"ratchet/internal/testenv"
	ratchetv1 "ratchet/messages/ratchet/v1"
)

// reading is what every format of TestPipelineFormatsFromTheRegistry
// carries; avro writes it with readingSchema.
type reading struct {
	ID     string    `avro:"id" json:"id"`
	Metric string    `avro:"metric" json:"metric"`
	Value  float64   `avro:"value" json:"value"`
	Time   time.Time `avro:"time" json:"time"`
	Region *string   `avro:"region" json:"region"`
	Site   site      `avro:"site" json:"site"`
}

type site struct {
	Name string `avro:"name" json:"name"`
}

const readingSchema = `{"type": "record", "name": "Reading", "namespace": "shop", "fields": [
  {"name": "id", "type": "string"},
  {"name": "metric", "type": "string"},
  {"name": "value", "type": "double"},
  {"name": "time", "type": {"type": "long", "logicalType": "timestamp-millis"}},
  {"name": "region", "type": ["null", "string"], "default": null},
  {"name": "site", "type": {"type": "record", "name": "Site", "fields": [{"name": "name", "type": "string"}]}}
]}`

// TestPipelineFormatsFromTheRegistry: values framed by Confluent's own
// serializers (Avro, Protobuf, JSON Schema), decoded with the writer's
// schema from the registry, are upserted by a pipeline; tombstones delete;
// an unknown schema id is dead-lettered.
func TestPipelineFormatsFromTheRegistry(t *testing.T) {
	for _, format := range []string{config.PipelineAvro, config.PipelineProtobuf, config.PipelineJSON} {
		t.Run(format, func(t *testing.T) {
			const n = 300
			cluster, addr := testenv.Kafka(t, 2, topic, topic+".dlq")
			db := testenv.Postgres(t)
			pool := openPool(t, db)
			if _, err := pool.Exec(context.Background(), `CREATE TABLE readings (id text PRIMARY KEY, metric text,
				value double precision, at timestamptz, region text, site text)`); err != nil {
				t.Fatal(err)
			}
			reg := testenv.NewRegistry(t, "", "")
			client, err := schemaregistry.NewClient(schemaregistry.NewConfig(reg.URL()))
			if err != nil {
				t.Fatal(err)
			}
			// Each format's serializer, and the expressions that read its
			// shape of a reading.
			var ser func(r *reading) []byte
			region, siteExpr := "value.region", "value.site.name"
			switch format {
			case config.PipelineAvro:
				conf := avrov2.NewSerializerConfig()
				conf.AutoRegisterSchemas = false
				conf.UseSchemaID = reg.Add(topic+"-value", "", readingSchema)
				s, err := avrov2.NewSerializer(client, serde.ValueSerde, conf)
				if err != nil {
					t.Fatal(err)
				}
				ser = func(r *reading) []byte {
					b, err := s.Serialize(topic, r)
					if err != nil {
						t.Fatalf("serialize: %v", err)
					}
					return b
				}
			case config.PipelineProtobuf:
				s, err := protobuf.NewSerializer(client, serde.ValueSerde, protobuf.NewSerializerConfig())
				if err != nil {
					t.Fatal(err)
				}
				region, siteExpr = `"region" in value.labels ? value.labels.region : null`, "value.labels.site"
				ser = func(r *reading) []byte {
					ev := &ratchetv1.Event{Id: r.ID, Metric: r.Metric, Value: r.Value, Time: timestamppb.New(r.Time),
						Labels: map[string]string{"site": r.Site.Name}}
					if r.Region != nil {
						ev.Labels["region"] = *r.Region
					}
					b, err := s.Serialize(topic, ev)
					if err != nil {
						t.Fatalf("serialize: %v", err)
					}
					return b
				}
			case config.PipelineJSON:
				conf := jsonschema.NewSerializerConfig()
				conf.AutoRegisterSchemas = false
				conf.UseSchemaID = reg.Add(topic+"-value", "JSON", `{"type":"object"}`)
				s, err := jsonschema.NewSerializer(client, serde.ValueSerde, conf)
				if err != nil {
					t.Fatal(err)
				}
				ser = func(r *reading) []byte {
					doc, err := json.Marshal(r)
					if err != nil {
						t.Fatal(err)
					}
					b, err := s.Serialize(topic, json.RawMessage(doc))
					if err != nil {
						t.Fatalf("serialize: %v", err)
					}
					return b
				}
			}
			cfg := testConfig(t, addr, db, config.ModeExactlyOnce)
			cfg.SchemaRegistry.URL = config.SecretURL(reg.URL())
			cfg.Pipelines = []config.Pipeline{{Name: "readings", Topic: topic, Format: format,
				Upsert: &config.Upsert{Table: "readings", OnTombstone: config.TombstoneDelete,
					Key: []config.Column{{Name: "id", Expr: "string(record.key)"}},
					Columns: []config.Column{{Name: "metric", Expr: "value.metric"}, {Name: "value", Expr: "value.value"},
						{Name: "at", Expr: "timestamp(value.time)"}, {Name: "region", Expr: region}, {Name: "site", Expr: siteExpr}}}}}
			if format == config.PipelineJSON {
				cfg.Pipelines[0].Upsert.Columns[2].Expr = "timestamp(value.time)"
			}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}

			base := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
			want := map[string]string{}
			var msgs []*kafka.Message
			tp := topic
			for i := range n {
				id := fmt.Sprintf("r%d", i%50)
				part := int32(i % 50 % 2)
				m := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &tp, Partition: part}, Key: []byte(id)}
				if i%23 == 22 {
					delete(want, id) // tombstone
				} else {
					r := &reading{ID: id, Metric: []string{"temp", "hum"}[i%2], Value: float64(i) / 4,
						Time: base.Add(time.Duration(i) * time.Second), Site: site{Name: fmt.Sprintf("s%d", i%3)}}
					reg := "null"
					if i%5 != 0 {
						rg := []string{"eu", "us"}[i%2]
						r.Region, reg = &rg, rg
					}
					m.Value = ser(r)
					want[id] = fmt.Sprintf("%s %s %v %s %s %s", id, r.Metric, r.Value, r.Time.Format(time.RFC3339), reg, r.Site.Name)
				}
				msgs = append(msgs, m)
			}
			indexes := []int(nil)
			if format == config.PipelineProtobuf {
				indexes = []int{0}
			}
			unknown := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &tp, Partition: 0}, Key: []byte("unknown"),
				Value: append(event.AppendFrame(nil, 9999, indexes), 1, 2, 3)}
			if format != config.PipelineJSON { // JSON is read without a lookup: its schema is not needed
				msgs = append(msgs, unknown)
			}
			produceMessages(t, addr, msgs)
			start(t, cfg, nil, "")
			waitAppliedToEnd(t, cluster, pool, cfg.Kafka.GroupID)

			var wantRows []string
			for _, r := range want {
				wantRows = append(wantRows, r)
			}
			sort.Strings(wantRows)
			rows, err := pool.Query(context.Background(), `SELECT id, metric, value, at, coalesce(region, 'null'), site FROM readings`)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for rows.Next() {
				var id, metric, region, site string
				var v float64
				var at time.Time
				if err := rows.Scan(&id, &metric, &v, &at, &region, &site); err != nil {
					t.Fatal(err)
				}
				got = append(got, fmt.Sprintf("%s %s %v %s %s %s", id, metric, v, at.UTC().Format(time.RFC3339), region, site))
			}
			sort.Strings(got)
			if strings.Join(got, "\n") != strings.Join(wantRows, "\n") {
				t.Fatalf("readings:\n%s", diff(got, wantRows))
			}
			if format != config.PipelineJSON {
				dl := readDLQ(t, cluster, addr, topic+".dlq", 1)
				if len(dl) != 1 || !strings.Contains(dl[0].headers["ratchet.error"], "schema id 9999 not found") {
					t.Fatalf("dead letters: %+v", dl)
				}
			}
		})
	}
}
