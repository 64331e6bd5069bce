package security

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"ratchet/config"
	"ratchet/internal/testenv"
)

// readHeaderTimeout is the server's limit for a request's headers
// (internal/web/server.go); slowMargin is what a busy machine may add.
const (
	readHeaderTimeout = 5 * time.Second
	slowMargin        = 5 * time.Second
)

// startServing runs the engine with HTTP on the default host, port 0, and
// returns it once it listens.
func startServing(tb testing.TB) *running {
	tb.Helper()
	_, addr := testenv.Kafka(tb, 1, topic)
	cfg := testConfig(tb, addr, testenv.Postgres(tb), nil)
	host, _, err := net.SplitHostPort(config.Default().HTTP.Addr)
	if err != nil {
		tb.Fatalf("default http.addr: %v", err)
	}
	cfg.HTTP.Addr = net.JoinHostPort(host, "0")
	return start(tb, cfg)
}

func TestHTTPDefaultsToLoopback(t *testing.T) {
	if got, want := config.Default().HTTP.Addr, "127.0.0.1:8080"; got != want {
		t.Errorf("default http.addr = %q, want %q", got, want)
	}
	loaded, err := config.Load("", nil)
	if err != nil {
		t.Fatalf("load defaults: %v", err)
	}
	if loaded.HTTP.Addr != config.Default().HTTP.Addr {
		t.Errorf("loaded http.addr = %q, want the default", loaded.HTTP.Addr)
	}
	r := startServing(t)
	host, _, err := net.SplitHostPort(r.addr)
	if err != nil {
		t.Fatalf("listen address %q: %v", r.addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		t.Errorf("engine listens on %s, want a loopback address", r.addr)
	}
}

func TestHTTPIsReadOnly(t *testing.T) {
	r := startServing(t)
	paths := []string{"/", "/healthz", "/readyz", "/api/state", "/metrics",
		"/static/app.js", "/static/style.css", "/static/favicon.svg", "/no/such/page"}
	methods := []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch,
		http.MethodOptions, http.MethodConnect, http.MethodTrace, "PROPFIND"}
	client := http.Client{Timeout: 10 * time.Second}
	for _, path := range paths {
		for _, method := range methods {
			t.Run(method+" "+path, func(t *testing.T) {
				req, err := http.NewRequest(method, "http://"+r.addr+path, strings.NewReader(`{"x":1}`))
				if err != nil {
					t.Fatal(err)
				}
				resp, err := client.Do(req)
				if err != nil {
					t.Fatalf("%s %s: %v", method, path, err)
				}
				defer resp.Body.Close()
				_, _ = io.Copy(io.Discard, resp.Body)
				if resp.StatusCode != http.StatusMethodNotAllowed {
					t.Errorf("%s %s: %s, want 405", method, path, resp.Status)
				}
				if allow := resp.Header.Get("Allow"); allow != "GET, HEAD" {
					t.Errorf("%s %s: Allow %q, want %q", method, path, allow, "GET, HEAD")
				}
			})
		}
	}
	t.Run("GET still works", func(t *testing.T) {
		if body := get(t, "http://"+r.addr+"/healthz"); body != "ok" {
			t.Errorf("/healthz = %q", body)
		}
	})
}

// TestHTTPSlowHeadersAreCut: a client that trickles a request's headers a
// byte at a time (slowloris) is disconnected once ReadHeaderTimeout has
// passed, however steadily it keeps sending; so is one that connects and
// sends nothing.
func TestHTTPSlowHeadersAreCut(t *testing.T) {
	t.Parallel()
	r := startServing(t)
	cases := []struct {
		name  string
		trick string // bytes sent one every 200 ms; never a complete request
	}{
		{"trickled header", "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + strings.Repeat("a", 200)},
		{"silent", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			conn, err := net.DialTimeout("tcp", r.addr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			began := time.Now()
			limit := readHeaderTimeout + slowMargin
			_ = conn.SetDeadline(began.Add(limit)) // the test never waits longer
			writerDone := make(chan struct{})
			go func() { // ends when the bytes run out or a write fails (the server closed)
				defer close(writerDone)
				for i := range len(tc.trick) {
					if _, err := conn.Write([]byte{tc.trick[i]}); err != nil {
						return
					}
					time.Sleep(200 * time.Millisecond) // the trickle itself, not a wait for a result
				}
			}()
			_, err = io.Copy(io.Discard, bufio.NewReader(conn))
			elapsed := time.Since(began)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("connection still open after %s (ReadHeaderTimeout %s)", elapsed.Round(time.Millisecond), readHeaderTimeout)
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("connection still open after %s", elapsed.Round(time.Millisecond))
			}
			if elapsed < readHeaderTimeout-time.Second {
				t.Errorf("connection closed after %s, before ReadHeaderTimeout %s: %v", elapsed, readHeaderTimeout, err)
			}
			t.Logf("server closed the connection after %s (read: %v)", elapsed.Round(time.Millisecond), err)
			_ = conn.Close()
			<-writerDone
		})
	}
}

// TestHTTPOversizedHeadersRefused: headers beyond the server's limit get
// 431, not an unbounded read.
func TestHTTPOversizedHeadersRefused(t *testing.T) {
	r := startServing(t)
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+r.addr+"/healthz", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Big", strings.Repeat("b", 1<<20))
	client := http.Client{Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		// The server may close before the client finished writing.
		t.Logf("oversized request: %v", err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("1 MiB of headers: %s, want 431", resp.Status)
	}
}
