package pipeline

import (
	"math"
	"testing"
	"time"
)

// TestKeyOfFollowsTheColumnsEquality: values the column holds as equal
// render one key; values it tells apart render two.
func TestKeyOfFollowsTheColumnsEquality(t *testing.T) {
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	cases := []struct {
		name  string
		typ   string
		a, b  any
		equal bool
	}{
		{"float zero and minus zero", "double precision", 0.0, math.Copysign(0, -1), true},
		{"NaNs", "double precision", math.NaN(), -math.NaN(), true},
		{"floats apart", "double precision", 0.1, 0.10000000001, false},
		{"real rounds", "real", 0.1, 0.10000000001, true},
		{"times under a microsecond apart", "timestamp with time zone", at.Add(100), at.Add(999), true},
		{"times a microsecond apart", "timestamp with time zone", at.Add(999), at.Add(1000), false},
		{"times before 1970 floor too", "timestamp with time zone", time.Unix(-1, 100), time.Unix(-1, 900), true},
		{"numeric spellings", "numeric", "1", " 1.0e0 ", true},
		{"numeric apart", "numeric", "1", "1.0000001", false},
		{"numeric scale rounds half away from zero", "numeric(5,2)", "-1.005", "-1.01", true},
		{"numeric scale keeps apart", "numeric(5,2)", "1.004", "1.006", false},
		{"numeric NaN", "numeric", "NaN", "nan", true},
		{"uuid spellings", "uuid", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "{A0EEBC999C0B4EF8BB6D6BB9BD380A11}", true},
		{"uuids apart", "uuid", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12", false},
		{"bpchar padding", "character(4)", "ab", "ab  ", true},
		{"varchar keeps spaces that fit", "character varying(4)", "ab", "ab  ", false},
		{"varchar drops excess spaces", "character varying(2)", "ab", "ab   ", true},
		{"varchar too long is not cut", "character varying(2)", "ab", "abc", false},
		{"text exact", "text", "ab", "ab ", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := wireOf(tc.typ)
			a, b := string(keyOf(nil, tc.a, k, tc.typ)), string(keyOf(nil, tc.b, k, tc.typ))
			if (a == b) != tc.equal {
				t.Fatalf("keys %q and %q: equal %v, want %v", a, b, a == b, tc.equal)
			}
		})
	}
}
