package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// memResult is the peak resident set of one `ratchet run` drain.
type memResult struct {
	Events  int64
	PeakMiB float64 // VmHWM when the backlog was drained
	Elapsed time.Duration
}

// ratchetProc is a `ratchet run` subprocess configured by environment.
type ratchetProc struct {
	cmd  *exec.Cmd
	done chan error
}

func startRatchet(bin string, env []string, logPath string) (*ratchetProc, error) {
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("ratchet log: %w", err)
	}
	cmd := exec.Command(bin, "run")
	cmd.Env = append(cleanEnv(), env...)
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start ratchet run: %w", err)
	}
	p := &ratchetProc{cmd: cmd, done: make(chan error, 1)}
	go func() { // ends when the process exits
		p.done <- cmd.Wait()
		lf.Close()
	}()
	return p, nil
}

// cleanEnv is the environment without RATCHET_* variables, so the caller's
// settings do not leak into the subprocess.
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RATCHET_") {
			out = append(out, kv)
		}
	}
	return out
}

// runVars is the environment of a `ratchet run` on this run's broker and
// database, reading topic in group, logging at level.
func (e *benchEnv) runVars(topic, group, level string) []string {
	return []string{
		"RATCHET_KAFKA_BROKERS=" + strings.Join(e.brokers, ","),
		"RATCHET_KAFKA_GROUP_ID=" + group,
		"RATCHET_KAFKA_TOPICS=" + topic,
		"RATCHET_POSTGRES_URL=" + e.db.url,
		"RATCHET_HTTP_ADDR=127.0.0.1:0",
		"RATCHET_LOG_LEVEL=" + level,
	}
}

// waitUntil asks done once every `every` until it reports true. It stops the
// process and returns an error when the process exits first, ctx ends,
// done fails, or within passes (naming done's progress).
func (p *ratchetProc) waitUntil(ctx context.Context, logPath string, every, within time.Duration,
	done func() (ok bool, progress string, err error)) error {
	deadline := time.Now().Add(within)
	for {
		select {
		case err := <-p.done:
			return fmt.Errorf("ratchet run exited early: %v (see %s)", err, logPath)
		case <-ctx.Done():
			_ = p.stop(30 * time.Second)
			return ctx.Err()
		case <-time.After(every):
		}
		ok, progress, err := done()
		if err != nil {
			_ = p.stop(30 * time.Second)
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			_ = p.stop(30 * time.Second)
			return fmt.Errorf("ratchet run: %s after %s", progress, within)
		}
	}
}

// stop sends SIGTERM and waits for the exit.
func (p *ratchetProc) stop(timeout time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		return err
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("pid %d did not stop within %s; killed", p.cmd.Process.Pid, timeout)
	}
}

// measureMemory drains topic (n records) with `ratchet run` at its defaults
// (exactly-once, dashboard) and reads its VmHWM once everything is stored.
func measureMemory(ctx context.Context, env *benchEnv, topic, group string, n int64) (memResult, error) {
	vars := env.runVars(topic, group, "warn")
	if env.maxBuffered > 0 {
		vars = append(vars, fmt.Sprintf("RATCHET_PROCESSING_MAX_BUFFERED_PER_PARTITION=%d", env.maxBuffered))
	}
	start := time.Now()
	logPath := env.outPath("ratchet-run-" + topic + ".log")
	p, err := startRatchet(env.ratchetBin, vars, logPath)
	if err != nil {
		return memResult{}, err
	}
	if err := p.waitUntil(ctx, logPath, 100*time.Millisecond, 10*time.Minute, func() (bool, string, error) {
		got, err := env.db.storedSum(ctx, group, topic)
		return got >= n, fmt.Sprintf("%d of %d stored", got, n), err
	}); err != nil {
		return memResult{}, err
	}
	elapsed := time.Since(start)
	hwm, err := procStatusKiB(p.cmd.Process.Pid, "VmHWM")
	if serr := p.stop(60 * time.Second); err == nil && serr != nil {
		err = fmt.Errorf("stop ratchet run: %w", serr)
	}
	if err != nil {
		return memResult{}, err
	}
	return memResult{Events: n, PeakMiB: float64(hwm) / 1024, Elapsed: elapsed}, nil
}
