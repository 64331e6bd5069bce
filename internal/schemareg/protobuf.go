package schemareg

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry"
	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry/serde"
	"github.com/jhump/protoreflect/desc"
	"github.com/jhump/protoreflect/desc/protoparse"

	ratchetv1 "ratchet/messages/ratchet/v1"
)

// eventName is the message a protobuf value must be to be decoded as an
// event.
var eventName = string((&ratchetv1.Event{}).ProtoReflect().Descriptor().FullName())

// parseProtobuf parses a registered protobuf schema the way Confluent's
// deserializer does (the schema text, the schemas it references by
// subject and version, google/protobuf/*.proto built in) and finds
// ratchet.v1.Event in it. A schema that does not parse is recorded as a
// problem (its values are poison); references that cannot be fetched
// because the registry is unavailable are an error.
func (s *Schema) parseProtobuf(client schemaregistry.Client, info schemaregistry.SchemaInfo) error {
	deps := map[string]string{}
	if err := serde.ResolveReferences(client, info, deps); err != nil {
		if isReferenceNotFound(err) {
			s.problem = fmt.Sprintf("schema id %d references a schema the registry does not have", s.ID)
			return nil
		}
		return fmt.Errorf("%w: references of schema id %d: %v", ErrUnavailable, s.ID, err)
	}
	const self = "registered schema"
	parser := protoparse.Parser{Accessor: func(name string) (io.ReadCloser, error) {
		text, ok := deps[name]
		if name == self {
			text, ok = info.Schema, true
		}
		if !ok {
			return nil, os.ErrNotExist // google/protobuf/*.proto are built in
		}
		return io.NopCloser(strings.NewReader(text)), nil
	}}
	fds, err := parser.ParseFiles(self)
	if err != nil || len(fds) != 1 {
		s.problem = fmt.Sprintf("schema id %d is not a protobuf schema that parses: %v", s.ID, shortErr(err))
		return nil
	}
	s.messages = map[string]string{}
	var walk func(path []int, msgs []*desc.MessageDescriptor)
	walk = func(path []int, msgs []*desc.MessageDescriptor) {
		for i, m := range msgs {
			p := append(append([]int(nil), path...), i)
			s.messages[fmt.Sprint(p)] = m.GetFullyQualifiedName()
			if m.GetFullyQualifiedName() == eventName {
				s.event = p
			}
			walk(p, m.GetNestedMessageTypes())
		}
	}
	walk(nil, fds[0].GetMessageTypes())
	s.file = fds[0]
	return nil
}

// checkEvent returns why values of s with the message indexes path cannot
// be decoded as ratchet.v1.Event, or "".
func (s *Schema) checkEvent(path []int) string {
	if s.problem != "" {
		return s.problem
	}
	if s.event == nil {
		return fmt.Sprintf("schema id %d does not define %s", s.ID, eventName)
	}
	if len(path) == len(s.event) {
		same := true
		for i := range path {
			if path[i] != s.event[i] {
				same = false
				break
			}
		}
		if same {
			return ""
		}
	}
	name, ok := s.messages[fmt.Sprint(path)]
	if !ok {
		return fmt.Sprintf("schema id %d has no message at indexes %v", s.ID, path)
	}
	return fmt.Sprintf("schema id %d: the value is %s, not %s", s.ID, name, eventName)
}

func shortErr(err error) string {
	if err == nil {
		return "no file"
	}
	var pe protoparse.ErrorWithPos
	if errors.As(err, &pe) {
		err = pe.Unwrap()
	}
	msg := err.Error()
	if len(msg) > 120 {
		msg = msg[:120] + "..."
	}
	return msg
}
