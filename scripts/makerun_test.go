// Package scripts holds the development scripts the Makefile runs; its
// test runs `make run` the way a newcomer does and stops it with Ctrl-C.
package scripts

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"ratchet/internal/testenv"
)

// TestMakeRunStopsCleanlyOnCtrlC: `make run` (PostgreSQL check, then
// `ratchet dev`) stopped with Ctrl-C, as a terminal sends it (SIGINT to
// the whole foreground process group: make, the recipe, ratchet), stops
// the engine cleanly and prints no error line: `go run` used to turn its
// child's clean stop into exit 1, and make then reported `make: ***
// [Makefile:12: run] Error 1`.
func TestMakeRunStopsCleanlyOnCtrlC(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("make", "--no-print-directory", "-C", root, "run", "BIN="+filepath.Join(t.TempDir(), "ratchet"))
	cmd.Env = append(os.Environ(),
		"RATCHET_POSTGRES_URL="+testenv.Postgres(t),
		"RATCHET_HTTP_ADDR=127.0.0.1:0",
		"RATCHET_LOG_DEAD_LETTERS=off",
	)
	// Its own process group, as a shell's job: the signal goes to all of it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	exited := make(chan error, 1)
	go func() { // ends when make exits
		err := cmd.Wait()
		_ = pw.Close()
		exited <- err
	}()
	var out testenv.Buffer
	started := make(chan struct{})
	go func() { // ends when the output closes (make exited)
		sc := bufio.NewScanner(pr)
		once := false
		for sc.Scan() {
			out.Write([]byte(sc.Text() + "\n"))
			if !once && strings.Contains(sc.Text(), "partition assigned") {
				once = true
				close(started)
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	select {
	case <-started:
	case err := <-exited:
		t.Fatalf("make run ended before the engine ran: %v\n%s", err, out.String())
	case <-time.After(3 * time.Minute):
		t.Fatalf("the engine did not start:\n%s", out.String())
	}
	if err := syscall.Kill(-pgid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	var waitErr error
	select {
	case waitErr = <-exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("make run still runs 60 s after Ctrl-C:\n%s", out.String())
	}
	t.Logf("make run ended %v after Ctrl-C: %v", time.Since(sent).Round(time.Millisecond), waitErr)
	text := out.String()
	if !strings.Contains(text, `msg="engine stopped"`) {
		t.Errorf("the engine did not report a clean stop:\n%s", text)
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "make: ***") || strings.Contains(line, "Error ") {
			t.Errorf("an error line after a clean stop: %q", line)
		}
	}
	// make ends by the SIGINT it received too (status 130 in a shell),
	// once ratchet exited 0; an exit status means a recipe failed.
	var ee *exec.ExitError
	if errors.As(waitErr, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGINT {
			t.Errorf("make run ended with %v, want killed by its SIGINT or exit 0", waitErr)
		}
	}
}
