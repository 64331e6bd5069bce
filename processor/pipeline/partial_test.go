package pipeline

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"ratchet/processor"
)

// treeOf is the field tree that reads paths ("a.b"; "" is all of value).
func treeOf(paths ...string) *fieldTree {
	t := &fieldTree{}
	for _, p := range paths {
		if p == "" {
			t.add(nil)
			continue
		}
		t.add(strings.Split(p, "."))
	}
	return t
}

// partialTrees are the read sets the equivalence tests decode with: their
// names are the keys the random documents use, so they meet hits, misses,
// duplicates and escaped spellings of the same key.
var partialTrees = []*fieldTree{
	treeOf("a"),
	treeOf("a.b", "c"),
	treeOf("a.b.c", "b"),
	treeOf("é", "a.é"),
	treeOf("b.a", "c.c.c"),
	treeOf("\x00", "a\"b"),
	treeOf("nope"),
	{},
}

// project is what decodePartial must give for t from the whole decode v.
func project(v any, t *fieldTree) any {
	m, ok := v.(map[string]any)
	if !ok || t.whole {
		return v
	}
	out := map[string]any{}
	for name, kid := range t.kids {
		if e, ok := m[name]; ok {
			out[name] = project(e, kid)
		}
	}
	return out
}

// checkPartial fails when decodePartial's answer for b differs from
// DecodeJSON's projected on t: another value, or another refusal.
func checkPartial(t testing.TB, b []byte, framed bool, tree *fieldTree) {
	t.Helper()
	full, ferr := DecodeJSON(b, framed)
	part, perr := decodePartial(b, framed, tree, &objects{})
	switch {
	case ferr != nil && perr == nil:
		t.Fatalf("%q %q: partial accepts %#v, the full decoder refuses: %v", b, tree.paths(), part, ferr)
	case ferr == nil && perr != nil:
		t.Fatalf("%q %q: partial refuses (%v), the full decoder accepts", b, tree.paths(), perr)
	case ferr != nil && ferr.Error() != perr.Error():
		t.Fatalf("%q %q: partial refuses with %q, the full decoder with %q", b, tree.paths(), perr, ferr)
	case ferr == nil:
		// A document the partial decoder leaves to the full one comes back
		// whole; what the expressions read of it is what counts.
		if want := project(full, tree); !reflect.DeepEqual(project(plainValue(part), tree), want) {
			t.Fatalf("%q %q: partial gives %#v, want %#v", b, tree.paths(), part, want)
		}
	}
}

// strictlyValid reports whether b is JSON whose every number, even in a
// duplicate key's discarded value, a float64 holds: what the scanner
// accepts (the full decoder never looks at discarded values).
func strictlyValid(b []byte) bool {
	if !json.Valid(b) {
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err != nil {
			return err == io.EOF
		}
		if n, ok := tok.(json.Number); ok {
			if _, err := strconv.ParseFloat(string(n), 64); err != nil {
				return false
			}
		}
	}
}

// scans reports whether the scanner alone (no fallback) accepts b.
func scans(b []byte) bool {
	s := scanner{b: b}
	s.space()
	ok := s.skip()
	s.space()
	return ok && s.i == len(s.b)
}

// randomJSON writes a random document: every JSON type, keys that repeat
// and are spelled with escapes, unicode, invalid UTF-8, big and odd
// numbers, odd whitespace, nesting.
func randomJSON(r *rand.Rand, sb *strings.Builder, depth int) {
	ws := func() {
		if r.IntN(4) == 0 {
			sb.WriteString([]string{" ", "\n", "\t", "\r", "  \n "}[r.IntN(5)])
		}
	}
	ws()
	kind := r.IntN(9)
	if depth > 6 && kind >= 7 {
		kind = r.IntN(7)
	}
	switch kind {
	case 0:
		sb.WriteString([]string{"true", "false", "null"}[r.IntN(3)])
	case 1, 2:
		sb.WriteString([]string{"0", "-0", "1", "-1", "12", "1.5", "-0.0", "1e3", "1E-3", "2.5e+10", "9223372036854775807",
			"9223372036854775808", "-9223372036854775809", "18446744073709551616", "1e308", "1.7976931348623157e308",
			"1e309", "-1e400", "1e-400", "4.9e-324", "123456789012345678901234567890", "0.000001", strings.Repeat("9", 309),
			strings.Repeat("9", 308), "1" + strings.Repeat("0", 308) + ".5"}[r.IntN(25)])
	case 3, 4:
		sb.WriteString(randomString(r))
	case 5, 6, 7:
		sb.WriteByte('{')
		n := r.IntN(5)
		for i := range n {
			if i > 0 {
				sb.WriteByte(',')
			}
			ws()
			sb.WriteString(randomKey(r))
			ws()
			sb.WriteByte(':')
			randomJSON(r, sb, depth+1)
		}
		ws()
		sb.WriteByte('}')
	case 8:
		sb.WriteByte('[')
		n := r.IntN(4)
		for i := range n {
			if i > 0 {
				sb.WriteByte(',')
			}
			randomJSON(r, sb, depth+1)
		}
		sb.WriteByte(']')
	}
	ws()
}

func randomKey(r *rand.Rand) string {
	return []string{`"a"`, `"b"`, `"c"`, `"é"`, `"\u00e9"`, `"\u0061"`, `"a\"b"`, `"\u0000"`, `"nope"`, `"a"`, `"b"`,
		`"\ud800"`, "\"\xff\"", `"A"`, `"a "`}[r.IntN(15)]
}

func randomString(r *rand.Rand) string {
	return []string{`""`, `"x"`, `"with \"quotes\" and \\ and \/"`, `"\b\f\n\r\t"`, `"\u00e9\u4e2d\ud83d\ude00"`,
		`"\ud800"`, `"\udc00\ud800x"`, "\"\xff\xfe bad utf8\"", `"é中😀"`, "\"\x7f\"", `"long ` + strings.Repeat("z", 100) + `"`,
		`"\uD83D\uDE00"`}[r.IntN(12)]
}

// mutate breaks a document the ways bytes from Kafka are broken.
func mutate(r *rand.Rand, b []byte) []byte {
	if len(b) == 0 {
		return b
	}
	out := append([]byte(nil), b...)
	i := r.IntN(len(out))
	switch r.IntN(6) {
	case 0:
		return out[:i]
	case 1:
		return append(out[:i], out[i+1:]...)
	case 2:
		const bytes = "{}[]\",:\\ 0-+.eEtfnu\x00\x01\x1f\x80x"
		out[i] = bytes[r.IntN(len(bytes))]
		return out
	case 3:
		return append(out, []string{"x", " {}", "1", "\x00", "  ", ",", "}"}[r.IntN(7)]...)
	case 4:
		ins := []string{",", ":", "\"", "\\", "\x05", "01", "1.", "-", ".5", "1e", "tru", "nul", "\\u12", "\\x"}[r.IntN(14)]
		return append(out[:i], append([]byte(ins), out[i:]...)...)
	default:
		return append([]byte("\x00\x00\x00\x00\x01"), out...)
	}
}

// TestDecodePartialEquivalence: on random and broken documents of every
// kind, the partial decoder gives, on the read paths, what the full
// decoder gives, and refuses exactly what it refuses with the same
// reason; and its scanner accepts exactly what encoding/json accepts.
func TestDecodePartialEquivalence(t *testing.T) {
	r := rand.New(rand.NewPCG(33, 2))
	fixed := []string{
		`{}`, ` {"a":1} `, `{"a":{"b":2},"a":{"c":3}}`, `{"a":{"b":2},"a":5}`, `{"a":5,"a":{"b":2}}`, `{"a":{"b":{"c":1},"b":{"d":1}}}`,
		`{"\u0061":1,"a":2}`, `{"a":2,"\u0061":1}`, `{"a":1e400}`, `{"z":1e400,"a":1}`, `{"z":[1,{"y":-1e309}],"a":1}`,
		`{"a":1}{}`, `{"a":1} x`, `{"a":1}]`, `{"a":01}`, `{"a":1.}`, `{"a":-}`, `{"a":.5}`, `{"a":1e}`, `{"a":+1}`,
		`{"a":"\x"}`, `{"a":"\u12"}`, "{\"a\":\"\x01\"}", `{"a":tru}`, `{"a":nul}`, `{"a" 1}`, `{"a":1,}`, `{,}`, `{"a"}`,
		`{'a':1}`, `{a:1}`, "\xef\xbb\xbf{}", `{"a":1`, `{"a":[1,2}`, `{"a":[1,]}`, ``, ` `, `null`, `[]`, `"x"`, `1`, `1e400`,
		"\x00\x00\x00\x00\x01{\"a\":1}", "\x00\x00\x00\x00", "\x00{}", `{"a":"` + strings.Repeat("é", 50) + `"}`,
		`{"a":{"b":[` + strings.Repeat(`[`, 200) + strings.Repeat(`]`, 200) + `]}}`,
		`{"c":"\ud83d\ude00","b":"\udc00","a":{"b":"\ud800\ud800"}}`,
		"{\"\xff\":1,\"\xef\xbf\xbd\":2}", `{"a":NaN}`, `{"a":Infinity}`, `{"a":-Infinity}`, `{"a":0x10}`,
		`{"a":true,"b":false,"c":null}`, `{"é":{"b":1},"a":{"é":"x"}}`,
	}
	docs := make([][]byte, 0, 4000)
	for _, d := range fixed {
		docs = append(docs, []byte(d))
	}
	for range 800 {
		var sb strings.Builder
		if r.IntN(10) == 0 {
			randomJSON(r, &sb, 0)
		} else {
			sb.WriteByte('{')
			for i := range r.IntN(6) {
				if i > 0 {
					sb.WriteByte(',')
				}
				sb.WriteString(randomKey(r) + ":")
				randomJSON(r, &sb, 1)
			}
			sb.WriteByte('}')
		}
		doc := []byte(sb.String())
		docs = append(docs, doc, mutate(r, doc))
	}
	partial := 0
	for _, doc := range docs {
		for _, framed := range []bool{false, true} {
			for _, tree := range partialTrees {
				checkPartial(t, doc, framed, tree)
			}
		}
		_, err := DecodeJSON(doc, false)
		if scans(doc) != strictlyValid(doc) {
			t.Fatalf("%q: the scanner accepts it: %v; the full decoder: %v", doc, scans(doc), err)
		}
		if err == nil && len(doc) > 0 && strings.HasPrefix(strings.TrimLeft(string(doc), " \t\r\n"), "{") {
			partial++
		}
	}
	if partial < 500 {
		t.Errorf("only %d valid objects among the documents: the test checks too little", partial)
	}
}

// TestDecodePartialDepth: a document nested deeper than the partial
// decoder follows is decoded (or refused past encoding/json's own bound)
// by the full decoder, whether the depth is on a read path or not.
func TestDecodePartialDepth(t *testing.T) {
	for _, n := range []int{maxPartialDepth - 2, maxPartialDepth, maxPartialDepth + 1, 10001, 20000} {
		for _, wrap := range []string{`{"z":%s,"a":1}`, `{"a":{"b":%s}}`, `{"a":1,"b":{"a":%s}}`} {
			for _, inner := range []struct{ open, close string }{{"[", "]"}, {`{"a":`, "}"}} {
				nested := strings.Repeat(inner.open, n) + "1" + strings.Repeat(inner.close, n)
				if inner.open == "[" {
					nested = strings.Repeat("[", n) + strings.Repeat("]", n)
				}
				doc := fmt.Sprintf(wrap, nested)
				for _, tree := range partialTrees {
					checkPartial(t, []byte(doc), false, tree)
				}
			}
		}
	}
	// Past encoding/json's bound the reason is its own.
	doc := `{"a":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`
	if _, err := decodePartial([]byte(doc), false, treeOf("b"), nil); err == nil || !strings.Contains(err.Error(), "exceeded max depth") {
		t.Errorf("a document 10002 levels deep: %v, want the full decoder's depth refusal", err)
	}
}

// FuzzDecodePartial: on any bytes, the partial decoder agrees with the
// full decoder on what it reads, and refuses what it refuses with the
// same reason.
func FuzzDecodePartial(f *testing.F) {
	for _, s := range []string{`{"a":{"b":1,"c":[1,"x"]},"b":"\u00e9","c":1e400}`, `{"a":1,"a":{"b":2}}`, `{"\u0061":"x\ud800"}`,
		`{"a":18446744073709551616,"b":-0.0,"c":{"c":{"c":null}}}`, `[]`, `{`, "\x00\x00\x00\x00\x01{}", ""} {
		for i := range len(partialTrees) {
			f.Add([]byte(s), false, uint8(i))
			f.Add([]byte(s), true, uint8(i))
		}
	}
	f.Fuzz(func(t *testing.T, b []byte, framed bool, tree uint8) {
		checkPartial(t, b, framed, partialTrees[int(tree)%len(partialTrees)])
		if scans(b) != strictlyValid(b) && strings.Count(string(b), "[")+strings.Count(string(b), "{") <= maxPartialDepth {
			t.Fatalf("%q: the scanner accepts it: %v; strictly valid: %v", b, scans(b), strictlyValid(b))
		}
	})
}

// TestAPartitionsDecodedObjectsStayTheirs: one decoder (a partition's)
// carves every record's objects from shared chunks; records decoded later
// never change what an earlier record decoded to, across many chunks, with
// objects of every width and documents the partial decoder leaves to
// DecodeJSON in between.
func TestAPartitionsDecodedObjectsStayTheirs(t *testing.T) {
	tree := treeOf("id", "status", "amount", "customer.id", "items", "a.b.c.d.e.f")
	d := JSONDecoder{reads: tree, objects: &objects{}}
	recs := make([]processor.Record, 3000)
	for i := range recs {
		doc := fmt.Sprintf(`{"id":"o%d","status":"s%d","amount":%d.5,"customer":{"id":"c%d","tier":"gold"},"items":%d,"a":{"b":{"c":{"d":{"e":{"f":%d}}}}}}`, i, i%7, i, i, i%9, i)
		if i%10 == 3 {
			doc = fmt.Sprintf(`{"id":"o%d","id":"dup%d"}`, i, i) // a duplicate key: handled as DecodeJSON does
		}
		recs[i] = processor.Record{Value: []byte(doc)}
		if err := d.DecodeRecord(&recs[i]); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	for i := range recs {
		full, err := DecodeJSON(recs[i].Value, false)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := project(plainValue(recs[i].Decoded), tree), project(full, tree); !reflect.DeepEqual(got, want) {
			t.Fatalf("record %d after 3000 decodes: %#v, want %#v", i, got, want)
		}
	}
}

// TestAPartitionsDecoderKeepsNothingOfAppliedRecords: the strings of a
// partly decoded object share its record's value; once the record is
// dropped, the value is collected although the decoder (the partition's)
// goes on carving from its chunks.
func TestAPartitionsDecoderKeepsNothingOfAppliedRecords(t *testing.T) {
	d := JSONDecoder{reads: treeOf("status"), objects: &objects{}}
	collected := make(chan struct{}, 1)
	func() {
		doc := []byte(`{"status":"` + strings.Repeat("x", 1<<20) + `"}`)
		runtime.AddCleanup(&doc[0], func(ch chan struct{}) { ch <- struct{}{} }, collected)
		rec := processor.Record{Value: doc}
		if err := d.DecodeRecord(&rec); err != nil {
			t.Fatal(err)
		}
		if _, ok := rec.Decoded.(*object); !ok {
			t.Fatalf("decoded to %T, not a partly decoded object", rec.Decoded)
		}
	}()
	for range 50 {
		runtime.GC()
		select {
		case <-collected:
			rec := processor.Record{Value: []byte(`{"status":"paid"}`)}
			if err := d.DecodeRecord(&rec); err != nil || plainValue(rec.Decoded).(map[string]any)["status"] != "paid" {
				t.Fatalf("after the collection: %#v, %v", rec.Decoded, err)
			}
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatal("a record was dropped, but its value was never collected: the decoder keeps it alive")
}
