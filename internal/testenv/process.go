package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BuildRatchet builds cmd/ratchet into dir (tb.TempDir() when dir is
// empty) and returns the binary's path.
func BuildRatchet(tb testing.TB, dir string) string {
	tb.Helper()
	return build(tb, dir, "ratchet", "ratchet/cmd/ratchet")
}

// build builds the main package pkg into dir/name.
func build(tb testing.TB, dir, name, pkg string) string {
	tb.Helper()
	if dir == "" {
		dir = tb.TempDir()
	}
	bin := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		tb.Fatalf("build %s: %v", pkg, err)
	}
	return bin
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Process is one `ratchet run` (or any ratchet command) started by a test,
// its output in a log file and its HTTP address known, so that the test can
// signal it, read its metrics and its log, and wait for its exit. The test
// owns it: Start registers a cleanup that kills it if it still runs.
type Process struct {
	Name    string
	LogPath string
	// HTTP is the address of its metrics and health endpoints ("" when it
	// was started without one).
	HTTP string

	cmd     *exec.Cmd
	exited  chan struct{}
	err     error // set before exited is closed
	started time.Time
}

// ProcessOptions configure StartProcess.
type ProcessOptions struct {
	// Name names the process in messages and its log file (Name.log).
	Name string
	// Args are the command line after the binary; default "run".
	Args []string
	// Env is added to the test's environment.
	Env []string
	// LogDir receives the log file; default tb.TempDir().
	LogDir string
	// HTTP gives the process a free loopback port as http.addr.
	HTTP bool
}

// StartProcess starts bin with o.
func StartProcess(tb testing.TB, bin string, o ProcessOptions) *Process {
	tb.Helper()
	dir := o.LogDir
	if dir == "" {
		dir = tb.TempDir()
	}
	args := o.Args
	if len(args) == 0 {
		args = []string{"run"}
	}
	p := &Process{Name: o.Name, LogPath: filepath.Join(dir, o.Name+".log"), exited: make(chan struct{})}
	logf, err := os.Create(p.LogPath)
	if err != nil {
		tb.Fatal(err)
	}
	env := append(os.Environ(), o.Env...)
	if o.HTTP {
		p.HTTP = "127.0.0.1:" + strconv.Itoa(FreePort(tb))
		env = append(env, "RATCHET_HTTP_ADDR="+p.HTTP)
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		logf.Close()
		tb.Fatalf("start %s: %v", o.Name, err)
	}
	p.started = time.Now()
	go func() { // ends when the process exits
		p.err = p.cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	tb.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Err is the exit error (nil: exit 0); valid once Exited is closed.
func (p *Process) Err() error {
	<-p.exited
	return p.err
}

// ExitCode is the exit code, -1 for a signal; valid once Exited is closed.
func (p *Process) ExitCode() int {
	<-p.exited
	return p.cmd.ProcessState.ExitCode()
}

// Running reports whether the process has not exited yet.
func (p *Process) Running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Signal sends sig (ignored once the process has exited).
func (p *Process) Signal(sig syscall.Signal) {
	if p.Running() {
		_ = p.cmd.Process.Signal(sig)
	}
}

// Kill sends SIGKILL and waits for the exit.
func (p *Process) Kill() {
	p.Signal(syscall.SIGKILL)
	<-p.exited
}

// Term sends SIGTERM and waits at most within for the exit. It returns how
// long the exit took and whether it came in time; a process that is not
// gone by then is killed.
func (p *Process) Term(within time.Duration) (took time.Duration, inTime bool) {
	start := time.Now()
	p.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return time.Since(start), true
	case <-time.After(within):
		p.Kill()
		return time.Since(start), false
	}
}

// Metric reads the process's /metrics and returns the sum of every series
// of the metric name (all label sets), and whether any was found.
func (p *Process) Metric(ctx context.Context, name string) (float64, bool, error) {
	if p.HTTP == "" {
		return 0, false, errors.New(p.Name + " has no HTTP address")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.HTTP+"/metrics", nil)
	if err != nil {
		return 0, false, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	var sum float64
	found := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue // another metric whose name starts with name
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, false, fmt.Errorf("%s: parse %q: %w", p.Name, line, err)
		}
		sum += v
		found = true
	}
	return sum, found, sc.Err()
}

// Log returns what the process has written so far.
func (p *Process) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}
