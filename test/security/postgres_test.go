package security

import (
	"context"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"ratchet/internal/testenv"
)

// pgPassword is planted in postgres.url; no output may show it. The test
// server uses trust authentication, so any password connects.
const pgPassword = "PLANTED-pw-9x"

// withPassword returns dbURL with pgPassword as the password and the
// given query parameters set.
func withPassword(tb testing.TB, dbURL string, params map[string]string) string {
	tb.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		tb.Fatalf("parse %s: %v", dbURL, err)
	}
	user := "postgres"
	if u.User != nil && u.User.Username() != "" {
		user = u.User.Username()
	}
	u.User = url.UserPassword(user, pgPassword)
	q := u.Query()
	for k, v := range params {
		q.Set(k, v)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// serverSSL reports whether the test PostgreSQL server accepts TLS.
func serverSSL(tb testing.TB) bool {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := testenv.ConnectAdmin(ctx, tb)
	defer c.Close(ctx)
	var on string
	if err := c.QueryRow(ctx, "SHOW ssl").Scan(&on); err != nil {
		tb.Fatalf("show ssl: %v", err)
	}
	return on == "on"
}

// engineConnections counts the engine's connections to the database dbName,
// with and without TLS.
func engineConnections(tb testing.TB, adminDB string, dbName string) (withTLS, plain int64) {
	tb.Helper()
	pool := openPool(tb, adminDB)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
		FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
		WHERE a.datname = $1 AND a.application_name = 'ratchet'`, dbName).Scan(&withTLS, &plain)
	if err != nil {
		tb.Fatalf("read pg_stat_ssl: %v", err)
	}
	return withTLS, plain
}

// TestPostgresSSLModeHonoured runs the engine with each sslmode against the
// local server and checks the connections it makes: TLS exactly when asked
// for, and a clear, password-free error when the server cannot give what
// the mode demands.
func TestPostgresSSLModeHonoured(t *testing.T) {
	ssl := serverSSL(t)
	unrelatedCA := filepath.Join(t.TempDir(), "unrelated-ca.pem")
	_, caPEM := testenv.SelfSignedCert(t, "127.0.0.1")
	if err := os.WriteFile(unrelatedCA, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		params  map[string]string
		wantTLS bool   // connects, over TLS
		wantErr string // fails, with this in the error (lower case)
	}{
		{name: "disable", params: map[string]string{"sslmode": "disable"}},
		{name: "require", params: map[string]string{"sslmode": "require"}, wantTLS: true},
		{name: "verify-full with an unrelated CA", params: map[string]string{"sslmode": "verify-full", "sslrootcert": unrelatedCA},
			wantErr: "certificate"},
	}
	if !ssl {
		t.Log("the local server has ssl=off: sslmode=require must fail")
		cases[1].wantTLS, cases[1].wantErr = false, "ssl"
		cases[2].wantErr = "ssl"
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, addr := testenv.Kafka(t, 1, topic)
			base := testenv.Postgres(t)
			u, _ := url.Parse(base)
			dbName := strings.TrimPrefix(u.Path, "/")
			cfg := testConfig(t, addr, withPassword(t, base, tc.params), nil)
			cfg.Kafka.GroupID = "ratchet-sslmode-" + strings.Fields(tc.name)[0]

			if tc.wantErr != "" {
				logs := &testenv.Buffer{}
				ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
				defer cancel()
				err, stopped := runUntil(t, ctx, cfg, debugLog(logs))
				t.Logf("engine: %v", err)
				if stopped || err == nil {
					t.Fatalf("engine did not fail with %s: err=%v", tc.name, err)
				}
				if !strings.Contains(strings.ToLower(err.Error()), tc.wantErr) {
					t.Errorf("error %q does not mention %q", err, tc.wantErr)
				}
				if !strings.Contains(err.Error(), "REDACTED") {
					t.Errorf("error %q does not name the URL with its password redacted", err)
				}
				assertNoSecret(t, "engine error", err.Error(), pgPassword)
				assertNoSecret(t, "logs", logs.String(), pgPassword)
				return
			}

			produceAll(t, addr, nil, encode(t, events(1), 0))
			r := start(t, cfg)
			waitApplied(t, openPool(t, base), 1)
			var withTLS, plain int64
			testenv.Eventually(t, 30*time.Second, func() bool {
				withTLS, plain = engineConnections(t, testenv.AdminURL(), dbName)
				return withTLS+plain > 0
			}, "the engine connects to %s", dbName)
			if tc.wantTLS && (withTLS == 0 || plain > 0) {
				t.Errorf("sslmode %s: %d connections with TLS, %d without; want all with", tc.params["sslmode"], withTLS, plain)
			}
			if !tc.wantTLS && (plain == 0 || withTLS > 0) {
				t.Errorf("sslmode %s: %d connections with TLS, %d without; want none with", tc.params["sslmode"], withTLS, plain)
			}
			r.Stop(t)
			assertNoSecret(t, "logs", r.logs.String(), pgPassword)
		})
	}
}

// assertNoSecret fails the test when text holds secret, in any of the
// spellings it can take in a URL.
func assertNoSecret(tb testing.TB, what, text, secret string) {
	tb.Helper()
	for _, s := range []string{secret, url.QueryEscape(secret), url.PathEscape(secret)} {
		if i := strings.Index(text, s); i >= 0 {
			lo, hi := max(i-200, 0), min(i+len(s)+200, len(text))
			tb.Errorf("%s shows the secret %q: ...%s...", what, secret, text[lo:hi])
			return
		}
	}
}

// noTLSServer listens on loopback like a PostgreSQL server built without
// TLS: it answers every SSLRequest with 'N'. It returns host:port.
func noTLSServer(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("listen: %v", err)
	}
	var wg sync.WaitGroup
	tb.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() { // ends when the listener is closed
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { // ends when the client hangs up or after 10 s
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				req := make([]byte, 8) // length 8, code 80877103
				if _, err := io.ReadFull(c, req); err != nil {
					return
				}
				if _, err := c.Write([]byte("N")); err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, c)
			})
		}
	})
	return ln.Addr().String()
}

// TestPostgresRequireAgainstServerWithoutTLS: against a server that
// declines TLS (whatever the local server supports), sslmode=require never
// falls back to plain text, and the error says why without the password.
func TestPostgresRequireAgainstServerWithoutTLS(t *testing.T) {
	addr := noTLSServer(t)
	cfg := testConfig(t, "127.0.0.1:1", "postgres://postgres:"+pgPassword+"@"+addr+"/ratchet?sslmode=require&connect_timeout=3", nil)
	logs := &testenv.Buffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err, stopped := runUntil(t, ctx, cfg, debugLog(logs))
	t.Logf("engine: %v", err)
	if stopped || err == nil {
		t.Fatalf("engine did not fail with sslmode=require against a server without TLS: err=%v", err)
	}
	if !strings.Contains(err.Error(), "server refused TLS connection") {
		t.Errorf("error %q does not say the server refused TLS", err)
	}
	assertNoSecret(t, "engine error", err.Error(), pgPassword)
	assertNoSecret(t, "logs", logs.String(), pgPassword)
}

// outcomeTB records whether a helper skipped or failed the test, and
// ends the helper's goroutine as testing.T would.
type outcomeTB struct {
	testing.TB
	skipped, failed bool
}

func (o *outcomeTB) Helper()               {}
func (o *outcomeTB) Skipf(string, ...any)  { o.skipped = true; runtime.Goexit() }
func (o *outcomeTB) Skip(...any)           { o.skipped = true; runtime.Goexit() }
func (o *outcomeTB) SkipNow()              { o.skipped = true; runtime.Goexit() }
func (o *outcomeTB) Fatalf(string, ...any) { o.failed = true; runtime.Goexit() }
func (o *outcomeTB) Fatal(...any)          { o.failed = true; runtime.Goexit() }
func (o *outcomeTB) FailNow()              { o.failed = true; runtime.Goexit() }
func (o *outcomeTB) Errorf(string, ...any) { o.failed = true }
func (o *outcomeTB) Cleanup(func())        {}
func (o *outcomeTB) Logf(string, ...any)   {}

// TestNoPostgresFailsInCI: the helpers of this package treat a missing
// PostgreSQL as the rest of the suite does, a skip on a developer's
// machine and a failure when CI=true, never a green CI by skipping.
func TestNoPostgresFailsInCI(t *testing.T) {
	t.Setenv("RATCHET_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=2")
	for _, c := range []struct {
		ci           string
		skip, failed bool
	}{
		{"true", false, true},
		{"", true, false},
	} {
		t.Run("CI="+c.ci, func(t *testing.T) {
			t.Setenv("CI", c.ci)
			o := &outcomeTB{TB: t}
			done := make(chan struct{})
			go func() { // ends when serverSSL returns, skips or fails
				defer close(done)
				serverSSL(o)
			}()
			<-done
			if o.skipped != c.skip || o.failed != c.failed {
				t.Errorf("without PostgreSQL: skipped %v, failed %v; want skipped %v, failed %v", o.skipped, o.failed, c.skip, c.failed)
			}
		})
	}
}
