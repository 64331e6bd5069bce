package faults

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"ratchet/config"
)

// TestSoak runs the engine at a moderate rate with a chaos event every 30 s
// (database cut, slow database, broker cut, failing commits, a member
// joining and leaving) and checks that goroutines, memory and open files
// stay flat and that the invariants hold at the end. It runs with
// `make soak` (RATCHET_SOAK=1; RATCHET_SOAK_DURATION, default 10m).
func TestSoak(t *testing.T) {
	if os.Getenv("RATCHET_SOAK") == "" {
		t.Skip("soak test: run with make soak")
	}
	duration := 10 * time.Minute
	if d, err := time.ParseDuration(os.Getenv("RATCHET_SOAK_DURATION")); err == nil {
		duration = d
	}
	h := newHarness(t, 12, config.ModeExactlyOnce)
	stop := h.storedWatch()
	r := h.start(h.cfg)
	h.produceN(5000, poisoned)
	h.waitApplied(60 * time.Second)

	var cut atomic.Bool
	h.cluster.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
		h.cluster.KeepControl()
		if cut.Load() {
			return nil, errors.New("cut"), true
		}
		return nil, nil, false
	})
	chaos := []struct {
		name string
		do   func() func()
	}{
		{"postgres cut 5s", func() func() { h.proxy.Cut(); return h.proxy.Restore }},
		{"postgres 200ms for 5s", func() func() { h.proxy.Delay(200 * time.Millisecond); return func() { h.proxy.Delay(0) } }},
		{"broker cut 5s", func() func() { cut.Store(true); return func() { cut.Store(false) } }},
		{"commits failing 5s", func() func() {
			f := h.cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Err: kerr.CoordinatorLoadInProgress, Count: -1})
			return f.Remove
		}},
		{"member joins and leaves", func() func() { m := h.start(h.cfg); return func() { m.stop(t) } }},
	}
	var baseline sample
	end := time.Now().Add(duration)
	for i := 0; time.Now().Before(end); i++ {
		c := chaos[i%len(chaos)]
		t.Logf("chaos %d: %s", i, c.name)
		undo := c.do()
		hold(5 * time.Second) // the fault lasts 5 s; records already read keep being processed
		undo()
		for range 5 { // a moderate rate: ~1,000 events/s
			h.produceN(1000, poisoned)
			time.Sleep(time.Second) // pacing of the load
		}
		h.waitApplied(120 * time.Second)
		time.Sleep(15 * time.Second) // the rest of the 30 s period, under no chaos
		s := takeSample()
		if i == len(chaos)-1 {
			baseline = s // after one full round everything has warmed up
		}
		t.Logf("goroutines %d, rss %d MiB, fds %d", s.goroutines, s.rssKiB/1024, s.fds)
	}
	final := takeSample()
	r.stop(t)
	stop()
	h.check(false)
	if baseline.goroutines > 0 {
		if final.goroutines > baseline.goroutines*3/2+20 {
			t.Errorf("goroutines grew from %d to %d", baseline.goroutines, final.goroutines)
		}
		if final.rssKiB > baseline.rssKiB*3/2+64*1024 {
			t.Errorf("RSS grew from %d to %d KiB", baseline.rssKiB, final.rssKiB)
		}
		if final.fds > baseline.fds+20 {
			t.Errorf("open files grew from %d to %d", baseline.fds, final.fds)
		}
	}
}

type sample struct {
	goroutines int
	rssKiB     int64
	fds        int
}

func takeSample() sample {
	s := sample{goroutines: runtime.NumGoroutine()}
	if raw, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(raw), "\n") {
			if strings.HasPrefix(line, "VmRSS:") {
				f := strings.Fields(line)
				if len(f) >= 2 {
					s.rssKiB, _ = strconv.ParseInt(f[1], 10, 64)
				}
			}
		}
	}
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		s.fds = len(ents)
	}
	return s
}
