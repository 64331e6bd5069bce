package store_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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

// TestOpenQueryExecMode: a plain URL gets pgx's named prepared statements
// on a direct connection, and the session-free exec mode behind PgBouncer in
// transaction mode, which then leaves no named prepared statement on the
// server session after queries of every kind ratchet runs (query, exec,
// batch, copy); a default_query_exec_mode in the URL or key=value string
// still wins.
func TestOpenQueryExecMode(t *testing.T) {
	db := testenv.Postgres(t)
	pooler := testenv.StartPgBouncer(t, db, testenv.PgBouncerOptions{})
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	withMode := func(raw, mode string) string {
		v, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		q := v.Query()
		q.Set("default_query_exec_mode", mode)
		v.RawQuery = q.Encode()
		return v.String()
	}
	kv := "host=" + u.Hostname() + " port=" + u.Port() + " user=" + u.User.Username() +
		" dbname=" + strings.TrimPrefix(u.Path, "/") + " sslmode=disable default_query_exec_mode=exec"
	tests := []struct {
		name       string
		url        string
		want       pgx.QueryExecMode
		statements bool // named prepared statements stay on the session
		skipWork   bool // the pooler may move the statements' session
	}{
		{"plain url, direct", db, store.DirectExecMode, true, false},
		{"plain url, behind pgbouncer", pooler.URL(), store.PoolerExecMode, false, false},
		{"url sets cache_statement behind pgbouncer", withMode(pooler.URL(), "cache_statement"), pgx.QueryExecModeCacheStatement, true, true},
		{"url sets describe_exec", withMode(db, "describe_exec"), pgx.QueryExecModeDescribeExec, false, false},
		{"key value sets exec", kv, pgx.QueryExecModeExec, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := openPool(t, tt.url, 1)
			if got := pool.Config().ConnConfig.DefaultQueryExecMode; got != tt.want {
				t.Fatalf("DefaultQueryExecMode = %v, want %v", got, tt.want)
			}
			if tt.skipWork {
				return
			}
			if n := namedStatementsAfterWork(t, pool); (n > 0) != tt.statements {
				t.Errorf("%d named prepared statements on the session after the queries, want any: %v", n, tt.statements)
			}
		})
	}
}

// TestBehindPooler: PgBouncer is told from PostgreSQL and from a plain TCP
// proxy (which keeps one server session per connection), and an
// unreachable server is an error, not an answer.
func TestBehindPooler(t *testing.T) {
	db := testenv.Postgres(t)
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	proxied := *u
	proxied.Host = testenv.NewProxy(t, u.Host).Addr()
	for _, tt := range []struct {
		name string
		url  string
		want bool
	}{
		{"direct", db, false},
		{"tcp proxy", proxied.String(), false},
		{"pgbouncer", testenv.StartPgBouncer(t, db, testenv.PgBouncerOptions{}).URL(), true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := pgx.ParseConfig(tt.url)
			if err != nil {
				t.Fatal(err)
			}
			got, err := store.BehindPooler(testCtx(t), cfg)
			if err != nil || got != tt.want {
				t.Fatalf("BehindPooler = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		cfg, err := pgx.ParseConfig("postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=2")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.BehindPooler(testCtx(t), cfg); err == nil {
			t.Fatal("BehindPooler answered for a server that is not there")
		}
	})
}

// namedStatementsAfterWork runs a query, an exec, a batch and a copy on one
// connection of pool and returns how many prepared statements its server
// session then holds.
func namedStatementsAfterWork(tb testing.TB, pool *pgxpool.Pool) int {
	tb.Helper()
	ctx := testCtx(tb)
	var n int
	err := pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
		if _, err := c.Exec(ctx, "CREATE TABLE IF NOT EXISTS mode_probe (id bigint, label text)"); err != nil {
			return err
		}
		var one int64
		if err := c.QueryRow(ctx, "SELECT $1::bigint", int64(1)).Scan(&one); err != nil {
			return err
		}
		b := &pgx.Batch{}
		b.Queue("INSERT INTO mode_probe VALUES ($1, $2)", int64(1), "a")
		b.Queue("SELECT count(*) FROM mode_probe WHERE label = $1", "a")
		if err := c.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if _, err := c.CopyFrom(ctx, pgx.Identifier{"mode_probe"}, []string{"id", "label"},
			pgx.CopyFromRows([][]any{{int64(2), "b"}})); err != nil {
			return err
		}
		// The simple protocol, so this count does not prepare one itself.
		return c.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_statements", pgx.QueryExecModeSimpleProtocol).Scan(&n)
	})
	if err != nil {
		tb.Fatalf("queries: %v", err)
	}
	return n
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
