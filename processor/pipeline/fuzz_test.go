package pipeline

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzDecodeJSON: any bytes from Kafka decode into a value that is JSON
// again, or an error that says it is JSON's, never a panic, framed or not.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{`{"a":1,"b":[1.5,"x",null,true],"c":{"d":18446744073709551616}}`, `[]`, `"x"`, `1e400`, `{`, "\x00\x00\x00\x00\x01{}", "\x00", ""} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, b []byte, framed bool) {
		v, err := DecodeJSON(b, framed)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "json: ") {
				t.Fatalf("error %q does not say it is the JSON decoder's", err)
			}
			return
		}
		if _, err := json.Marshal(v); err != nil {
			t.Fatalf("decoded %q into %#v, which is not JSON: %v", b, v, err)
		}
	})
}
