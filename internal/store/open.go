package store

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultConnectTimeout bounds each new connection when the URL does not set
// connect_timeout, so a black-holed server fails Open instead of hanging.
const DefaultConnectTimeout = 10 * time.Second

// redacted replaces secrets in URLs and error messages.
const redacted = "REDACTED"

// Open parses url, builds a pool of at most maxConns connections (the pgx
// default when maxConns <= 0) and pings the server. The returned error never
// contains the password: it names the URL with the password replaced by
// REDACTED, and any password text in the driver's own message is masked too.
// ctx bounds the probe for a pooler and the ping; the pool outlives it. The
// caller closes the pool.
//
// Unless url sets default_query_exec_mode, Open finds out, before the pool
// runs any query, whether a connection pooler stands between ratchet and
// PostgreSQL (BehindPooler), and picks the query exec mode: PoolerExecMode,
// which keeps no state on the server session, behind one, so ratchet works
// behind a transaction-mode pooler (PgBouncer, pgcat) with a plain URL;
// DirectExecMode, pgx's fastest, on a direct connection.
func Open(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	secrets := passwords(url)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse postgres url %s: %w", RedactURL(url), scrub(err, secrets))
	}
	if cfg.ConnConfig.Password != "" {
		// The effective password may also come from PGPASSWORD or .pgpass.
		secrets = append(secrets, cfg.ConnConfig.Password)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
		if cfg.MinConns > maxConns {
			cfg.MinConns = maxConns
		}
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = DefaultConnectTimeout
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "ratchet"
	}
	if !setsQueryExecMode(url) {
		pooled, err := BehindPooler(ctx, cfg.ConnConfig)
		if err != nil {
			return nil, fmt.Errorf("connect to postgres %s: %w", RedactURL(url), scrub(err, secrets))
		}
		cfg.ConnConfig.DefaultQueryExecMode = DirectExecMode
		if pooled {
			cfg.ConnConfig.DefaultQueryExecMode = PoolerExecMode
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open postgres %s: %w", RedactURL(url), scrub(err, secrets))
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to postgres %s: %w", RedactURL(url), scrub(err, secrets))
	}
	return pool, nil
}

// PoolerExecMode is how Open's pools run queries behind a connection pooler
// when the URL does not name a default_query_exec_mode:
// QueryExecModeCacheDescribe.
//
// It is session-free. pgx's own default, QueryExecModeCacheStatement,
// creates a named prepared statement on the server session the first time a
// query runs and executes it by name afterwards. A transaction-mode pooler
// hands every transaction whichever server session is free, so the name is
// missing there (26000) or left behind by another client (42P05), and a
// client killed with -9 leaves its names on the pooled sessions for ever.
// CacheDescribe caches only the statement's description (parameter and
// result types) in the client; every execution sends the SQL with Parse,
// Bind and Execute of the unnamed statement in one message flight, which the
// pooler forwards to one server session. The types are the server's, as with
// CacheStatement, so queries bind and decode the same way; the cost is the
// SQL text sent with each execution (one round trip, as before).
// QueryExecModeDescribeExec would need two round trips on the same session
// and QueryExecModeExec infers parameter types from Go values. The server
// parses and plans each execution again: make bench (h) measured the
// exactly-once drain 13-17 % slower than with named prepared statements
// (median of the paired rounds, on a busy two-core machine), hence
// DirectExecMode where no pooler stands in between.
const PoolerExecMode = pgx.QueryExecModeCacheDescribe

// DirectExecMode is how Open's pools run queries on a direct connection to
// PostgreSQL when the URL does not name a default_query_exec_mode: pgx's
// default, named prepared statements cached per connection, which the
// connection's one server session keeps.
const DirectExecMode = pgx.QueryExecModeCacheStatement

// BehindPooler connects once with cfg and reports whether a connection
// pooler (or another proxy that multiplexes server sessions) answers
// instead of PostgreSQL itself. PostgreSQL sends each connection its
// backend's process id in BackendKeyData, the key of a cancel request; a
// pooler cannot (the client's server session changes), so PgBouncer and
// pgcat make up a key of their own, and the id differs from the one
// pg_backend_pid() returns. A plain TCP proxy passes the real key on, and
// keeps one server session per connection. The probe runs in the simple
// protocol and leaves nothing on the server session. An error is an error,
// never "direct": the caller fails as it would on the ping.
func BehindPooler(ctx context.Context, cfg *pgx.ConnConfig) (bool, error) {
	probe := cfg.Copy()
	probe.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, probe)
	if err != nil {
		return false, err
	}
	defer conn.Close(ctx)
	var pid uint32
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return false, fmt.Errorf("probe for a connection pooler: %w", err)
	}
	return pid != conn.PgConn().PID(), nil
}

// setsQueryExecMode reports whether the connection string raw names a
// default_query_exec_mode itself (URL parameter or key=value), which then
// wins over PoolerExecMode and DirectExecMode. pgx parses the value into
// ConnConfig and drops the key, so a parsed config cannot tell
// "cache_statement" from "not given": ask pgconn, which keeps unknown keys
// as runtime parameters.
func setsQueryExecMode(raw string) bool {
	c, err := pgconn.ParseConfig(raw)
	if err != nil {
		return false // pgxpool.ParseConfig parsed raw already; not reached
	}
	_, ok := c.RuntimeParams["default_query_exec_mode"]
	return ok
}

// kvPassword matches a password in a key=value connection string, quoted or
// not.
var kvPassword = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s]*)`)

// uriPassword matches the password of user:password@ in a URL that net/url
// rejects.
var uriPassword = regexp.MustCompile(`(://[^:/@\s]*:)[^@\s]*@`)

// RedactURL returns the connection string with its password (in the userinfo
// or in a password parameter) replaced by REDACTED. It accepts both the URL
// and the key=value forms and is safe to log.
func RedactURL(raw string) string {
	if !strings.Contains(raw, "://") {
		return kvPassword.ReplaceAllString(raw, "${1}"+redacted)
	}
	u, err := url.Parse(raw)
	if err != nil {
		s := uriPassword.ReplaceAllString(raw, "${1}"+redacted+"@")
		return kvPassword.ReplaceAllString(s, "${1}"+redacted)
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), redacted)
		}
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", redacted)
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// passwords extracts the password texts that raw carries, in every spelling
// that can show up in an error message.
func passwords(raw string) []string {
	var out []string
	add := func(s string) {
		if s == "" {
			return
		}
		out = append(out, s, url.QueryEscape(s), url.PathEscape(s))
		if d, err := url.QueryUnescape(s); err == nil {
			out = append(out, d)
		}
	}
	if u, err := url.Parse(raw); err == nil && strings.Contains(raw, "://") {
		if u.User != nil {
			if p, ok := u.User.Password(); ok {
				add(p)
			}
		}
		add(u.Query().Get("password"))
	}
	for _, m := range uriPassword.FindAllStringSubmatch(raw, -1) {
		add(strings.TrimSuffix(strings.TrimPrefix(m[0], m[1]), "@"))
	}
	for _, m := range kvPassword.FindAllStringSubmatch(raw, -1) {
		v := strings.TrimPrefix(m[0], m[1])
		add(v)
		add(strings.Trim(v, "'"))
	}
	return out
}

// scrubbedError carries err's chain, so errors.Is and IsTransient still
// classify it, with a message that has the passwords masked. Only Error is
// safe to print; the wrapped error's own message may hold the secret.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// scrub masks every secret in err's message. It returns err itself when the
// message holds none.
func scrub(err error, secrets []string) error {
	msg := err.Error()
	clean := msg
	for _, s := range secrets {
		if s != "" {
			clean = strings.ReplaceAll(clean, s, redacted)
		}
	}
	clean = uriPassword.ReplaceAllString(clean, "${1}"+redacted+"@")
	clean = kvPassword.ReplaceAllString(clean, "${1}"+redacted)
	if clean == msg {
		return err
	}
	return &scrubbedError{msg: clean, err: err}
}
