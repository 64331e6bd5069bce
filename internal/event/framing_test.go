package event

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry/serde"
)

// TestFrameMatchesSerde holds AppendFrame and ParseFrame to the framing of
// confluent-kafka-go's serde package, which Confluent's serializers write.
func TestFrameMatchesSerde(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	paths := [][]int{nil, {0}, {1}, {0, 0}, {3, 1, 2}, {127, 128, 300}}
	for range 50 {
		p := make([]int, 1+rng.IntN(5))
		for i := range p {
			p[i] = rng.IntN(1000)
		}
		paths = append(paths, p)
	}
	for _, path := range paths {
		id := int32(1 + rng.IntN(1<<30))
		payload := []byte("payload")
		schemaType, withIndexes := "PROTOBUF", true
		if path == nil {
			schemaType, withIndexes = "JSON", false
		}
		theirs, err := (&serde.SchemaID{SchemaType: schemaType, ID: int(id), MessageIndexes: path}).IDToBytes()
		if err != nil {
			t.Fatal(err)
		}
		ours := AppendFrame(nil, id, path)
		if !bytes.Equal(ours, theirs) {
			t.Errorf("AppendFrame(%d, %v) = %x, serde writes %x", id, path, ours, theirs)
		}
		value := append(theirs, payload...)
		f, err := ParseFrame(value, FormatProtobuf, withIndexes)
		if err != nil {
			t.Fatalf("ParseFrame(%x): %v", value, err)
		}
		read := serde.SchemaID{SchemaType: schemaType}
		n, err := read.FromBytes(value)
		if err != nil {
			t.Fatal(err)
		}
		want := read.MessageIndexes
		if f.SchemaID != id || int(f.SchemaID) != read.ID || !slices.Equal(f.MessageIndexes, want) ||
			!bytes.Equal(f.Payload, value[n:]) {
			t.Errorf("ParseFrame(%x) = %d %v %q; serde reads %d %v %q", value, f.SchemaID, f.MessageIndexes, f.Payload,
				read.ID, want, value[n:])
		}
	}
}

func TestParseFrameRefuses(t *testing.T) {
	cases := []struct {
		name  string
		value []byte
		want  string
	}{
		{"empty", nil, "empty value"},
		{"no magic byte", []byte(`{"metric":"m"}`), "no magic byte: the value starts with 0x7b"},
		{"plain protobuf", []byte{0x12, 0x01, 'm'}, "no magic byte"},
		{"short id", []byte{0, 0, 1}, "truncated schema registry framing"},
		{"no indexes", []byte{0, 0, 0, 0, 7}, "schema id 7: unreadable message index count"},
		{"negative count", []byte{0, 0, 0, 0, 7, 0x01}, "message index count -1"},
		{"huge count", []byte{0, 0, 0, 0, 7, 0xfe, 0xff, 0xff, 0xff, 0x0f}, "out of range"},
		{"missing index", []byte{0, 0, 0, 0, 7, 0x04, 0x02}, "schema id 7: unreadable message index 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseFrame(tc.value, FormatProtobuf, true)
			var e *Error
			if !errors.As(err, &e) || e.Kind != KindDecode || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseFrame(%x) = %v, want a decode *Error containing %q", tc.value, err, tc.want)
			}
			if !IsPoison(err) {
				t.Error("not poison")
			}
		})
	}
}

// FuzzParseFrame: ParseFrame never panics, refuses only with a poison
// *Error of bounded length, and reads what serde reads.
func FuzzParseFrame(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 1, 0, 0x0a, 0x01, 'x'}, true)
	f.Add([]byte{0, 0, 0, 0, 1, 0x04, 0x02, 0x00, 0x0a}, true)
	f.Add([]byte{0, 0, 0, 1, 0, '{', '}'}, false)
	f.Add([]byte{1, 2, 3}, true)
	f.Add([]byte{0, 0, 0, 0, 7, 0xfe, 0xff, 0xff, 0xff, 0x0f}, true)
	f.Fuzz(func(t *testing.T, value []byte, withIndexes bool) {
		fr, err := ParseFrame(value, FormatProtobuf, withIndexes)
		if err != nil {
			if !IsPoison(err) || len(err.Error()) > maxErrorBytes {
				t.Fatalf("error %q is not a bounded poison *Error", err)
			}
			return
		}
		if id, ok := SchemaIDOf(value); !ok || id != fr.SchemaID {
			t.Fatalf("SchemaIDOf = %d, %v; ParseFrame read %d", id, ok, fr.SchemaID)
		}
		schemaType := "JSON"
		if withIndexes {
			schemaType = "PROTOBUF"
		}
		read := serde.SchemaID{SchemaType: schemaType}
		n, serr := read.FromBytes(value)
		if serr != nil {
			t.Fatalf("ParseFrame accepted %x, serde refuses: %v", value, serr)
		}
		if int(uint32(fr.SchemaID)) != read.ID && int(fr.SchemaID) != read.ID || !slices.Equal(fr.MessageIndexes, read.MessageIndexes) ||
			!bytes.Equal(fr.Payload, value[n:]) {
			t.Fatalf("ParseFrame(%x) = %d %v; serde %d %v", value, fr.SchemaID, fr.MessageIndexes, read.ID, read.MessageIndexes)
		}
	})
}
