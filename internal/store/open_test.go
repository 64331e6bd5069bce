package store_test

import (
	"strings"
	"testing"

	"ratchet/internal/store"
	"ratchet/internal/testenv"
)

func TestOpen(t *testing.T) {
	pool := openPool(t, testenv.Postgres(t), 3)
	cfg := pool.Config()
	if cfg.MaxConns != 3 {
		t.Errorf("MaxConns = %d, want 3", cfg.MaxConns)
	}
	if cfg.ConnConfig.ConnectTimeout != store.DefaultConnectTimeout {
		t.Errorf("ConnectTimeout = %s, want %s", cfg.ConnConfig.ConnectTimeout, store.DefaultConnectTimeout)
	}
	var one int
	if err := pool.QueryRow(testCtx(t), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("select 1 = %d, %v", one, err)
	}
}

func TestOpenErrorHidesPassword(t *testing.T) {
	const secret = "s3cr%23t-pw"
	tests := []struct {
		name string
		url  string
	}{
		{"refused url", "postgres://ratchet:" + secret + "@127.0.0.1:1/ratchet?sslmode=disable&connect_timeout=2"},
		{"refused password parameter", "postgres://ratchet@127.0.0.1:1/ratchet?sslmode=disable&connect_timeout=2&password=" + secret},
		{"refused key value", "host=127.0.0.1 port=1 user=ratchet password=" + secret + " sslmode=disable connect_timeout=2"},
		{"bad port", "postgres://ratchet:" + secret + "@127.0.0.1:notaport/ratchet"},
		{"bad escape", "postgres://ratchet:" + secret + "%zz@127.0.0.1:5432/ratchet"},
		{"bad parameter", "postgres://ratchet:" + secret + "@127.0.0.1:5432/ratchet?sslmode=maybe"},
		{"bad key value", "host=127.0.0.1 password='" + secret + "' sslmode=maybe"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool, err := store.Open(testCtx(t), tt.url, 1)
			if err == nil {
				pool.Close()
				t.Fatal("Open succeeded")
			}
			t.Logf("error: %v", err)
			for _, s := range []string{secret, "s3cr#t-pw", "s3cr%23t"} {
				if strings.Contains(err.Error(), s) {
					t.Errorf("error shows the password %q: %v", s, err)
				}
			}
		})
	}
}

func TestRedactURL(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"userinfo", "postgres://u:pw@db:5432/x?sslmode=require", "postgres://u:REDACTED@db:5432/x?sslmode=require"},
		{"no password", "postgres://u@db/x", "postgres://u@db/x"},
		{"no user", "postgresql://db/x", "postgresql://db/x"},
		{"query password", "postgres://u@db/x?password=pw", "postgres://u@db/x?password=REDACTED"},
		{"key value", "host=db password=pw user=u", "host=db password=REDACTED user=u"},
		{"key value quoted", "host=db password='p w' user=u", "host=db password=REDACTED user=u"},
		{"unparseable", "postgres://u:p%zzw@db/x", "postgres://u:REDACTED@db/x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := store.RedactURL(tt.in); got != tt.want {
				t.Errorf("RedactURL(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}
