package faults

import (
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"ratchet/config"
	"ratchet/internal/testenv"
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
	h.rollups = true
	stop := h.storedWatch()
	// The engine under watch runs as its own process, so that its
	// goroutines, memory and files are measured apart from the broker and
	// the test's bookkeeping.
	p := h.startProcess()
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
		{"member joins and leaves", func() func() { m := h.startProcess(); return func() { m.stop(t) } }},
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
		s := p.sample(t)
		if i == len(chaos)-1 {
			baseline = s // after one full round everything has warmed up
		}
		t.Logf("goroutines %d, rss %d MiB, fds %d", s.goroutines, s.rssKiB/1024, s.fds)
	}
	final := p.sample(t)
	p.stop(t)
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

// proc is a ratchet process started by the test.
type proc struct {
	cmd     *exec.Cmd
	done    chan error
	metrics string // http://addr/metrics
}

func (h *harness) startProcess() *proc {
	h.t.Helper()
	bin := testenv.BuildRatchet(h.t, "")
	port := testenv.FreePort(h.t)
	cmd := exec.Command(bin, "run")
	cmd.Env = append(os.Environ(), "RATCHET_KAFKA_BROKERS="+h.addr, "RATCHET_POSTGRES_URL="+h.cfg.Postgres.URL.Reveal(),
		"RATCHET_KAFKA_GROUP_ID="+h.cfg.Kafka.GroupID, "RATCHET_HTTP_ADDR=127.0.0.1:"+strconv.Itoa(port),
		"RATCHET_RETRY_MAX_BACKOFF=2s", "RATCHET_LOG_LEVEL=warn")
	logPath := filepath.Join(h.t.TempDir(), "ratchet.log")
	logf, err := os.Create(logPath)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		if h.t.Failed() {
			out, _ := os.ReadFile(logPath)
			if len(out) > 4000 {
				out = out[len(out)-4000:]
			}
			h.t.Logf("ratchet log tail:\n%s", out)
		}
	})
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	p := &proc{cmd: cmd, done: make(chan error, 1), metrics: "http://127.0.0.1:" + strconv.Itoa(port) + "/metrics"}
	go func() { p.done <- cmd.Wait(); logf.Close() }() // ends when the process exits
	h.t.Cleanup(func() { _ = cmd.Process.Kill() })
	return p
}

func (p *proc) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("ratchet exited with %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Error("ratchet did not stop within 60s")
	}
}

// sample reads the process's goroutines (from /metrics), RSS and open files.
func (p *proc) sample(t *testing.T) sample {
	t.Helper()
	var s sample
	pid := strconv.Itoa(p.cmd.Process.Pid)
	if raw, err := os.ReadFile("/proc/" + pid + "/status"); err == nil {
		for _, line := range strings.Split(string(raw), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
				s.rssKiB, _ = strconv.ParseInt(f[1], 10, 64)
			}
		}
	}
	if ents, err := os.ReadDir("/proc/" + pid + "/fd"); err == nil {
		s.fds = len(ents)
	}
	resp, err := http.Get(p.metrics)
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "go_goroutines ") {
			v, _ := strconv.ParseFloat(strings.TrimPrefix(line, "go_goroutines "), 64)
			s.goroutines = int(v)
		}
	}
	return s
}
