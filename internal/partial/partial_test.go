package partial

import (
	"fmt"
	"reflect"
	"testing"
)

// TestFieldsReadAsTheirMap: Get and Plain give what the map of the fields
// that have a value gives, for few names (compared in turn) and many
// (indexed), nested Fields included.
func TestFieldsReadAsTheirMap(t *testing.T) {
	for _, n := range []int{1, 4, 5, 8, 9, 20} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			names := make([]string, n)
			for i := range names {
				names[i] = fmt.Sprintf("f%d", i)
			}
			f := New(names, Index(names))
			want := map[string]any{}
			for i := range names {
				switch i % 3 {
				case 0:
					f.Vals[i] = int64(i)
					want[names[i]] = int64(i)
				case 1:
					f.Vals[i] = Absent
				case 2:
					inner := New([]string{"id"}, nil)
					inner.Vals[0] = fmt.Sprint("c", i)
					f.Vals[i] = inner
					want[names[i]] = map[string]any{"id": fmt.Sprint("c", i)}
				}
			}
			for i, name := range names {
				v, ok := f.Get(name)
				_, wantOK := want[name]
				if ok != wantOK {
					t.Fatalf("Get(%q) ok %v, want %v", name, ok, wantOK)
				}
				if ok && i%3 == 0 && v != want[name] {
					t.Fatalf("Get(%q) = %v, want %v", name, v, want[name])
				}
			}
			if _, ok := f.Get("missing"); ok {
				t.Fatal("Get of a name not read: ok")
			}
			if got := Plain(f); !reflect.DeepEqual(got, want) {
				t.Fatalf("Plain = %#v, want %#v", got, want)
			}
		})
	}
	if got := Plain("x"); got != "x" {
		t.Fatalf("Plain of a non-Fields value changed it: %v", got)
	}
}

// TestFieldsOfFewNamesAreOneAllocation: the point of the type.
func TestFieldsOfFewNamesAreOneAllocation(t *testing.T) {
	names := []string{"status", "amount"}
	var f *Fields
	if n := testing.AllocsPerRun(100, func() { f = New(names, nil) }); n != 1 {
		t.Fatalf("New of two names: %v allocations, want 1", n)
	}
	_ = f
}
