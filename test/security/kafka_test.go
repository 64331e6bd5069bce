package security

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"ratchet/config"
	"ratchet/internal/testenv"
)

func TestSASLSCRAMConsumesAndApplies(t *testing.T) {
	_, addr := testenv.KafkaSASL(t, 3, scram256, saslUser, saslPassword, topic)
	dbURL := testenv.Postgres(t)
	props := saslProps(saslPassword)
	const n = 200
	produceAll(t, addr, props, encode(t, events(n), 0))

	r := start(t, testConfig(t, addr, dbURL, props))
	waitApplied(t, openPool(t, dbURL), n)
	r.Stop(t)
}

// TestSASLWrongPasswordFailsClearly pins what a wrong SASL password does:
// the start fails (reading the topics for the dead-letter check) well
// within its 30 s budget, and the logs carry librdkafka's "SASL
// authentication error" at warn. kfake drops the connection on bad
// credentials instead of answering SASL_AUTHENTICATION_FAILED, so the
// returned error itself reads "Broker transport failure".
func TestSASLWrongPasswordFailsClearly(t *testing.T) {
	t.Parallel()
	_, addr := testenv.KafkaSASL(t, 1, scram256, saslUser, saslPassword, topic)
	dbURL := testenv.Postgres(t)
	const wrong = "wrong-pw-planted"
	cfg := testConfig(t, addr, dbURL, saslProps(wrong))

	logs := &testenv.Buffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	err, stopped := runUntil(t, ctx, cfg, debugLog(logs))
	t.Logf("engine: %v", err)
	if stopped {
		t.Fatalf("engine still running after 40s with a wrong SASL password; want the start to fail")
	}
	if err == nil || !strings.Contains(err.Error(), "read topics from") {
		t.Errorf("engine error = %v, want the start to fail reading the topics", err)
	}
	if !hasLogLine(t, logs.String(), "WARN", "SASL authentication error") {
		t.Errorf("no warn line names the SASL authentication error:\n%s", tail(logs.String(), 4000))
	}
	for _, secret := range []string{wrong, saslPassword} {
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("engine error shows the password: %v", err)
		}
		if strings.Contains(logs.String(), secret) {
			t.Errorf("logs show the password %q", secret)
		}
	}
}

func TestTLSToKafka(t *testing.T) {
	_, addr, caPEM := testenv.KafkaTLS(t, 2, topic)
	dbURL := testenv.Postgres(t)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	const n = 100
	cases := []struct {
		name  string
		props config.Properties
	}{
		{"ssl.ca.location", config.Properties{"security.protocol": "SSL", "ssl.ca.location": caFile}},
		{"ssl.ca.pem", config.Properties{"security.protocol": "SSL", "ssl.ca.pem": string(caPEM)}},
	}
	produceAll(t, addr, cases[0].props, encode(t, events(n), 0))
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, addr, dbURL, tc.props)
			cfg.Kafka.GroupID = "ratchet-tls-" + tc.name
			cfg.Commit.Mode = config.ModeAtLeastOnce
			pool := openPool(t, dbURL)
			r := start(t, cfg)
			waitApplied(t, pool, int64(n*(i+1)))
			r.Stop(t)
		})
	}
}

// TestTLSUntrustedCertificateFailsClearly: a broker whose certificate the
// configured CA did not sign fails the start, and the logs say why.
func TestTLSUntrustedCertificateFailsClearly(t *testing.T) {
	t.Parallel()
	_, addr, _ := testenv.KafkaTLS(t, 1, topic)
	dbURL := testenv.Postgres(t)
	_, otherCA := testenv.SelfSignedCert(t, "127.0.0.1")
	cfg := testConfig(t, addr, dbURL, config.Properties{"security.protocol": "SSL", "ssl.ca.pem": string(otherCA)})

	logs := &testenv.Buffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	err, stopped := runUntil(t, ctx, cfg, debugLog(logs))
	t.Logf("engine: %v", err)
	if stopped || err == nil {
		t.Errorf("engine did not fail against an untrusted broker certificate: err=%v", err)
	}
	if !hasLogLine(t, logs.String(), "WARN", "certificate verify failed") {
		t.Errorf("no warn line names the certificate failure:\n%s", tail(logs.String(), 4000))
	}
}

// hasLogLine reports whether a JSON log line at level has a message or
// message attribute containing text.
func hasLogLine(tb testing.TB, logs, level, text string) bool {
	tb.Helper()
	for _, line := range strings.Split(logs, "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			tb.Fatalf("log line is not JSON: %q", line)
		}
		if rec["level"] != level {
			continue
		}
		for _, k := range []string{"msg", "message"} {
			if s, ok := rec[k].(string); ok && strings.Contains(s, text) {
				return true
			}
		}
	}
	return false
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
