package chaos

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	ratchetv1 "ratchet/messages/ratchet/v1"
	"ratchet/processor"
)

func TestParsePanicChoice(t *testing.T) {
	for _, tc := range []struct {
		environ []string
		want    PanicChoice
		err     string
	}{
		{environ: []string{"HOME=/root", "RATCHET_COMMIT_MODE=exactly_once"}},
		{environ: []string{"RATCHET_CHAOS_PANIC_EVERY=1000", "HOME=/root"}, want: PanicChoice{Every: 1000}},
		{environ: []string{"RATCHET_CHAOS_PANIC_ALWAYS=5000", "RATCHET_CHAOS_PANIC_EVERY=0"}, want: PanicChoice{Always: 5000}},
		{environ: []string{"RATCHET_CHAOS_PANIC_EVERY="}},
		{environ: []string{"RATCHET_CHAOS_PANIC_EVERY=-3"}, err: `RATCHET_CHAOS_PANIC_EVERY="-3": want a whole number`},
		{environ: []string{"RATCHET_CHAOS_PANIC_ALWAYS=often"}, err: `RATCHET_CHAOS_PANIC_ALWAYS="often": want a whole number`},
	} {
		got, rest, err := ParsePanicChoice(tc.environ)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: error %v, want %q", tc.environ, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%v: %+v, %v; want %+v", tc.environ, got, err, tc.want)
		}
		// The engine's configuration never sees the chaos variables.
		if i := slices.IndexFunc(rest, func(kv string) bool { return strings.HasPrefix(kv, "RATCHET_CHAOS_") }); i >= 0 {
			t.Errorf("%v: %q left in the environment", tc.environ, rest[i])
		}
	}
}

func TestPanicChoiceShares(t *testing.T) {
	c := PanicChoice{Every: 100, Always: 1000}
	chosen, poison := 0, 0
	for i := range 100_000 {
		id := fmt.Sprintf("s1-%09d", i)
		if c.Chosen(id) && c.Poison(id) {
			t.Fatalf("%s chosen both once and always", id)
		}
		if c.Chosen(id) {
			chosen++
		}
		if c.Poison(id) {
			poison++
		}
	}
	// About 1 in 100 and 1 in 1,000 (less the overlap).
	if chosen < 900 || chosen > 1100 || poison < 80 || poison > 120 {
		t.Errorf("%d chosen once and %d always of 100,000; want about 990 and 100", chosen, poison)
	}
	if (PanicChoice{}).Chosen("s1-000000000") || (PanicChoice{}).Poison("s1-000000000") {
		t.Error("the zero PanicChoice chooses a record")
	}
}

type counting struct{ batches int }

func (*counting) Name() string      { return "counting" }
func (*counting) ReadsEvents() bool { return true }
func (c *counting) Process(context.Context, pgx.Tx, processor.Batch) error {
	c.batches++
	return nil
}

// panics calls Process and returns the panic's value ("" for none).
func panics(p processor.Processor, b processor.Batch) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = fmt.Sprint(r)
		}
	}()
	_ = p.Process(context.Background(), nil, b)
	return ""
}

func TestPanickyPanicsOncePerRecordOrAlways(t *testing.T) {
	c := PanicChoice{Every: 10, Always: 7}
	var once, always, plain string
	for i := 0; once == "" || always == "" || plain == ""; i++ {
		id := fmt.Sprintf("e-%d", i)
		switch {
		case c.Poison(id):
			always = id
		case c.Chosen(id):
			once = id
		default:
			plain = id
		}
	}
	batch := func(ids ...string) processor.Batch {
		b := processor.Batch{Topic: "events", Partition: 3}
		for i, id := range ids {
			b.Records = append(b.Records, processor.Record{Topic: "events", Partition: 3, Offset: int64(i),
				Event: &ratchetv1.Event{Id: id}})
		}
		// A record without an event (raw) is never chosen.
		b.Records = append(b.Records, processor.Record{Topic: "events", Partition: 3, Offset: int64(len(ids))})
		return b
	}
	inner := &counting{}
	p := Panicky(inner, c)
	if er, ok := p.(processor.EventReader); !ok || !er.ReadsEvents() || p.Name() != "counting" {
		t.Fatal("Panicky hides the inner processor's name or that it reads events")
	}
	if msg := panics(p, batch(plain, once)); !strings.HasPrefix(msg, PanicPrefix+" (once) on event "+once+" at events/3@1") {
		t.Fatalf("first batch with %s: panic %q", once, msg)
	}
	if msg := panics(p, batch(plain, once)); msg != "" || inner.batches != 1 {
		t.Fatalf("second batch with %s: panic %q, %d batches applied; want no panic, 1", once, msg, inner.batches)
	}
	for range 3 {
		if msg := panics(p, batch(plain, always)); !strings.HasPrefix(msg, PanicPrefix+" (always) on event "+always) {
			t.Fatalf("batch with %s: panic %q", always, msg)
		}
	}
	if inner.batches != 1 {
		t.Fatalf("%d batches reached the inner processor, want 1", inner.batches)
	}
}
