package pipeline

import (
	"strings"
	"testing"
)

// A number no float64 holds is refused when the value is decoded, as
// "number out of range" without its digits, wherever it is in the
// document; it used to reach the expressions as a string, whose
// conversion failed as "type conversion error from 'string' to 'double'".
func TestDecodeJSONNumberOutOfRange(t *testing.T) {
	for _, doc := range []string{`1e400`, `{"amount": 1e400}`, `{"a": [1, {"b": -2e308}]}`} {
		t.Run(doc, func(t *testing.T) {
			v, err := DecodeJSON([]byte(doc), false)
			if err == nil || err.Error() != "json: number out of range (beyond ±1.8e308)" {
				t.Fatalf("DecodeJSON(%s) = %#v, %v; want number out of range", doc, v, err)
			}
			if strings.Contains(err.Error(), "400") {
				t.Errorf("the error quotes the value: %v", err)
			}
		})
	}
	v, err := DecodeJSON([]byte(`{"a": [1, 1.5e300, 18446744073709551616, 1e-400]}`), false)
	if err != nil {
		t.Fatal(err)
	}
	if a := v.(map[string]any)["a"].([]any); a[0] != int64(1) || a[1] != 1.5e300 || a[2] != 18446744073709551616.0 || a[3] != 0.0 {
		t.Errorf("numbers in range: %#v", a)
	}
}
