package chaos

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"ratchet/processor"
)

// The variables that choose the records a panicking processor (Panicky)
// panics on, read by the chaos build of ratchet (test/chaos/panicky).
const (
	// EnvPanicEvery=N: panic once per process on every record whose event
	// id hashes to 0 modulo N (PanicChoice.Chosen). The supervised restart
	// applies the record again and it goes through: every record is still
	// applied exactly once.
	EnvPanicEvery = "RATCHET_CHAOS_PANIC_EVERY"
	// EnvPanicAlways=M: panic on every attempt at a record whose event id
	// hashes to 0 modulo M. The engine bisects the batch and dead-letters
	// the record: it counts as poison.
	EnvPanicAlways = "RATCHET_CHAOS_PANIC_ALWAYS"
)

// PanicPrefix starts the value of every planned panic, so that a restart
// caused by one can be told from any other in the logs.
const PanicPrefix = "chaos: planned panic"

// PanicChoice says which records a Panicky processor panics on. The zero
// value chooses none.
type PanicChoice struct {
	Every  uint64 // panic once per process on ids hashing to 0 mod Every (0: none)
	Always uint64 // panic on every attempt at ids hashing to 0 mod Always (0: none)
}

// ParsePanicChoice reads EnvPanicEvery and EnvPanicAlways from environ
// (KEY=VALUE entries) and returns environ without them.
func ParsePanicChoice(environ []string) (PanicChoice, []string, error) {
	var c PanicChoice
	rest := make([]string, 0, len(environ))
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		var dst *uint64
		switch name {
		case EnvPanicEvery:
			dst = &c.Every
		case EnvPanicAlways:
			dst = &c.Always
		default:
			rest = append(rest, kv)
			continue
		}
		if value == "" {
			continue
		}
		n, err := strconv.ParseUint(value, 10, 64)
		if err != nil {
			return PanicChoice{}, nil, fmt.Errorf("%s=%q: want a whole number (0: never)", name, value)
		}
		*dst = n
	}
	return c, rest, nil
}

// idHash is the hash both choices take modulo their number: FNV-1a,
// mixed (splitmix64's finaliser) so that ids that differ in a digit or
// two spread evenly over every modulus.
func idHash(id string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(id))
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// Chosen reports whether the record with event id id is panicked on once
// per process (EnvPanicEvery).
func (c PanicChoice) Chosen(id string) bool {
	return c.Every > 0 && !c.Poison(id) && idHash(id)%c.Every == 0
}

// Poison reports whether the record with event id id is panicked on at
// every attempt (EnvPanicAlways): the engine dead-letters it.
func (c PanicChoice) Poison(id string) bool {
	return c.Always > 0 && idHash(id)%c.Always == 0
}

// Panicky wraps a processor that reads events (the dashboard) so that it
// panics, before the inner processor sees the batch, on the records c
// chooses: on the first batch of this process that holds a Chosen record,
// and on every batch that holds a Poison one.
func Panicky(inner processor.Processor, c PanicChoice) processor.Processor {
	return &panicky{inner: inner, c: c, done: map[string]bool{}}
}

type panicky struct {
	inner processor.Processor
	c     PanicChoice

	mu   sync.Mutex
	done map[string]bool // Chosen ids panicked on once already
}

func (p *panicky) Name() string { return p.inner.Name() }

// ReadsEvents passes on the inner processor's answer (processor.EventReader).
func (p *panicky) ReadsEvents() bool {
	er, ok := p.inner.(processor.EventReader)
	return ok && er.ReadsEvents()
}

func (p *panicky) Process(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
	for _, rec := range b.Records {
		if rec.Event == nil {
			continue
		}
		id := rec.Event.Id
		if p.c.Poison(id) {
			panic(fmt.Sprintf("%s (always) on event %s at %s/%d@%d", PanicPrefix, id, rec.Topic, rec.Partition, rec.Offset))
		}
		if p.c.Chosen(id) && p.first(id) {
			panic(fmt.Sprintf("%s (once) on event %s at %s/%d@%d", PanicPrefix, id, rec.Topic, rec.Partition, rec.Offset))
		}
	}
	return p.inner.Process(ctx, tx, b)
}

// first records that id is panicked on and reports whether it was not
// before.
func (p *panicky) first(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done[id] {
		return false
	}
	p.done[id] = true
	return true
}
