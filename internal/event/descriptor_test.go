package event

import (
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	ratchetv1 "ratchet/messages/ratchet/v1"
)

// TestEventDescriptor pins the compiled message to the event contract in
// DESIGN.md, so an edit to proto/ or to the generated code that changes the
// wire format fails here as well as in scripts/check-proto.sh.
func TestEventDescriptor(t *testing.T) {
	md := (&ratchetv1.Event{}).ProtoReflect().Descriptor()
	if got, want := md.FullName(), protoreflect.FullName("ratchet.v1.Event"); got != want {
		t.Fatalf("message name = %s, want %s", got, want)
	}
	if got, want := md.ParentFile().Path(), "ratchet/v1/event.proto"; got != want {
		t.Errorf("file path = %s, want %s", got, want)
	}
	if got := md.ParentFile().Syntax(); got != protoreflect.Proto3 {
		t.Errorf("syntax = %v, want proto3", got)
	}
	if n := md.Oneofs().Len(); n != 0 {
		t.Errorf("message has %d oneofs, want none", n)
	}

	type field struct {
		name    protoreflect.Name
		json    string
		number  protoreflect.FieldNumber
		kind    protoreflect.Kind
		list    bool
		message protoreflect.FullName // for message kinds
		key     protoreflect.Kind     // for maps
		value   protoreflect.Kind     // for maps
	}
	want := []field{
		{name: "id", json: "id", number: 1, kind: protoreflect.StringKind},
		{name: "metric", json: "metric", number: 2, kind: protoreflect.StringKind},
		{name: "value", json: "value", number: 3, kind: protoreflect.DoubleKind},
		{name: "time", json: "time", number: 4, kind: protoreflect.MessageKind, message: "google.protobuf.Timestamp"},
		{name: "labels", json: "labels", number: 5, kind: protoreflect.MessageKind,
			key: protoreflect.StringKind, value: protoreflect.StringKind},
	}
	fields := md.Fields()
	if fields.Len() != len(want) {
		t.Errorf("message has %d fields, want %d", fields.Len(), len(want))
	}
	for _, w := range want {
		t.Run(string(w.name), func(t *testing.T) {
			fd := fields.ByName(w.name)
			if fd == nil {
				t.Fatalf("field %s is missing", w.name)
			}
			if fd.Number() != w.number {
				t.Errorf("number = %d, want %d", fd.Number(), w.number)
			}
			if fd.Kind() != w.kind {
				t.Errorf("kind = %v, want %v", fd.Kind(), w.kind)
			}
			if fd.JSONName() != w.json {
				t.Errorf("JSON name = %q, want %q", fd.JSONName(), w.json)
			}
			if fd.HasPresence() && fd.Kind() != protoreflect.MessageKind {
				t.Errorf("scalar field has explicit presence (optional), want implicit")
			}
			if fd.ContainingOneof() != nil {
				t.Errorf("field is in oneof %s", fd.ContainingOneof().FullName())
			}
			isMap := w.key != 0
			if fd.IsMap() != isMap {
				t.Fatalf("IsMap = %v, want %v", fd.IsMap(), isMap)
			}
			if isMap {
				if k := fd.MapKey().Kind(); k != w.key {
					t.Errorf("map key kind = %v, want %v", k, w.key)
				}
				if v := fd.MapValue().Kind(); v != w.value {
					t.Errorf("map value kind = %v, want %v", v, w.value)
				}
				return
			}
			if fd.IsList() != w.list {
				t.Errorf("IsList = %v, want %v", fd.IsList(), w.list)
			}
			if w.message != "" {
				if fd.Message() == nil || fd.Message().FullName() != w.message {
					t.Errorf("message type = %v, want %s", fd.Message(), w.message)
				}
			}
		})
	}
}
