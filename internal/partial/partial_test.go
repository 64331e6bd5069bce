package partial

import (
	"fmt"
	"reflect"
	"runtime"
	"testing"
	"time"
	"unsafe"
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
			f := (*Slab)(nil).Fields(names, Index(names)) // allocated on their own
			want := map[string]any{}
			for i := range names {
				switch i % 3 {
				case 0:
					f.Vals[i] = int64(i)
					want[names[i]] = int64(i)
				case 1:
					f.Vals[i] = Absent
				case 2:
					inner := (*Slab)(nil).Fields([]string{"id"}, nil)
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

// TestSlabCarvesWithoutAnAllocationEach: the point of the Slab. Values
// carved from it never share a slot, and a nil Slab still works.
func TestSlabCarvesWithoutAnAllocationEach(t *testing.T) {
	names := []string{"status", "amount"}
	s := &Slab{}
	var fs []*Fields
	allocs := testing.AllocsPerRun(1000, func() { fs = append(fs[:0], s.Fields(names, nil)) })
	if allocs > 0.1 {
		t.Fatalf("Slab.Fields of two names: %v allocations each, want a chunk's share (< 0.1)", allocs)
	}
	seen := map[*any]bool{}
	for range 500 {
		f := s.Fields(names, nil)
		for i := range f.Vals {
			if seen[&f.Vals[i]] {
				t.Fatal("a value slot was handed out twice")
			}
			seen[&f.Vals[i]] = true
		}
		if cap(f.Vals) != len(names) {
			t.Fatalf("Vals has room past its fields: cap %d", cap(f.Vals))
		}
	}
	wide := make([]string, 100)
	if f := s.Fields(wide, Index(wide)); len(f.Vals) != 100 {
		t.Fatalf("a wide record has %d values", len(f.Vals))
	}
	var nilSlab *Slab
	if f := nilSlab.Fields(names, nil); len(f.Vals) != 2 {
		t.Fatalf("the nil Slab gave %d values", len(f.Vals))
	}
}

// TestSlabKeepsNothingOfDroppedValues: once the values carved from a Slab
// are dropped, what they pointed at is collected; the Slab, still in use,
// does not keep its chunks' old values alive (an idle partition holds
// none of the records it applied), and carves on afterwards.
func TestSlabKeepsNothingOfDroppedValues(t *testing.T) {
	s := &Slab{}
	collected := make(chan struct{}, 1)
	func() {
		doc := make([]byte, 1<<20) // a record's value, which a JSON string shares
		runtime.AddCleanup(&doc[0], func(ch chan struct{}) { ch <- struct{}{} }, collected)
		f := s.Fields([]string{"a", "b"}, nil)
		f.Vals[0] = unsafe.String(&doc[0], len(doc))
		runtime.KeepAlive(f)
	}()
	for range 50 {
		runtime.GC()
		select {
		case <-collected:
			if f := s.Fields([]string{"a"}, nil); len(f.Vals) != 1 || f.Vals[0] != nil {
				t.Fatalf("after the collection the Slab gave %#v", f.Vals)
			}
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatal("a value the Slab carved was dropped, but what it pointed at was never collected: the Slab keeps it alive")
}

// Chunks never hands a slot out twice, and a slice of slots is capped at
// its length, so appending to it cannot write over the next one's.
func TestChunksHandOutEachSlotOnce(t *testing.T) {
	var c Chunks[int]
	var kept [][]int // reachable, so their chunks stay current
	for i := range 100 {
		s := c.Take(3, 16)
		if len(s) != 3 || cap(s) != 3 {
			t.Fatalf("take %d: len %d cap %d, want 3 and 3", i, len(s), cap(s))
		}
		for j := range s {
			if s[j] != 0 {
				t.Fatalf("take %d: slot %d was handed out before (holds %d)", i, j, s[j])
			}
			s[j] = i + 1
		}
		kept = append(kept, s)
	}
	for i, s := range kept {
		for j, v := range s {
			if v != i+1 {
				t.Fatalf("take %d slot %d = %d, want %d: a later take wrote over it", i, j, v, i+1)
			}
		}
	}
}
