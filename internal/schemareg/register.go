package schemareg

import (
	"bytes"
	"fmt"

	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry"
	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry/serde"
	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry/serde/protobuf"
	"google.golang.org/protobuf/proto"

	"ratchet/config"
	"ratchet/internal/event"
	ratchetv1 "ratchet/messages/ratchet/v1"
)

// EventJSONSchema is the JSON Schema of ratchet.v1.Event in its canonical
// JSON form (protojson), registered for topics of format json.
const EventJSONSchema = `{"$schema":"http://json-schema.org/draft-07/schema#","title":"ratchet.v1.Event","type":"object",` +
	`"properties":{"id":{"type":"string"},"metric":{"type":"string","minLength":1,"maxLength":200},` +
	`"value":{"type":["number","string"]},"time":{"type":"string","format":"date-time"},` +
	`"labels":{"type":"object","additionalProperties":{"type":"string"}}},"required":["metric","time"]}`

// RegisterEvent registers the schema of ratchet.v1.Event for the values of
// topic (subject <topic>-value, Confluent's default naming) in format
// (protobuf or json) and returns the framing to put before each encoded
// event, and the schema id. For protobuf the schema is registered by
// Confluent's own serializer, and the framing is the one it writes.
func RegisterEvent(cfg config.SchemaRegistry, topic, format string) (frame []byte, id int, err error) {
	client, err := NewClient(cfg)
	if err != nil {
		return nil, 0, err
	}
	defer client.Close()
	switch format {
	case event.FormatProtobuf, "":
		ser, err := protobuf.NewSerializer(client, serde.ValueSerde, protobuf.NewSerializerConfig())
		if err != nil {
			return nil, 0, err
		}
		sample := &ratchetv1.Event{Metric: "sample"}
		framed, err := ser.Serialize(topic, sample)
		if err != nil {
			return nil, 0, fmt.Errorf("register the protobuf schema of %s for %s: %s", eventName, topic, config.RedactURL(err.Error()))
		}
		payload, err := proto.Marshal(sample)
		if err != nil {
			return nil, 0, err
		}
		if !bytes.HasSuffix(framed, payload) {
			return nil, 0, fmt.Errorf("unexpected serializer output %x", framed)
		}
		frame = framed[:len(framed)-len(payload)]
		f, err := event.ParseFrame(framed, format, true)
		if err != nil {
			return nil, 0, err
		}
		return frame, int(f.SchemaID), nil
	case event.FormatJSON:
		id, err := client.Register(topic+"-value", schemaregistry.SchemaInfo{Schema: EventJSONSchema, SchemaType: TypeJSON}, false)
		if err != nil {
			return nil, 0, fmt.Errorf("register the JSON schema of %s for %s: %s", eventName, topic, config.RedactURL(err.Error()))
		}
		return event.AppendFrame(nil, int32(id), nil), id, nil
	default:
		return nil, 0, fmt.Errorf("register: %w %q", event.ErrUnknownFormat, format)
	}
}
