package testenv

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgbouncerNames are where Debian's pgbouncer package installs the server.
var pgbouncerNames = []string{"/usr/sbin/pgbouncer", "pgbouncer"}

// PgBouncerOptions configures PgBouncer. The zero value is a transaction
// mode pooler with a small server pool.
type PgBouncerOptions struct {
	// PoolSize is default_pool_size: the server connections per database
	// and user (zero: 4). A small pool makes consecutive transactions of
	// one client land on different server sessions, which is what a
	// session-dependent client trips on.
	PoolSize int
	// QueryWait is query_wait_timeout: how long a client waits for a server
	// connection before pgbouncer refuses the query (zero: 120s, the
	// pgbouncer default).
	QueryWait time.Duration
}

// PgBouncer is a pgbouncer process in transaction pool mode in front of the
// PostgreSQL server of a test database, on a free loopback port. It is
// stopped when the test ends.
type PgBouncer struct {
	bin  string
	dir  string // config, auth file, pidfile
	ini  string
	port int
	url  string // the test database's URL through the pooler
	log  *Buffer

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
}

// PgBouncerPath returns the path of a pgbouncer executable
// (RATCHET_TEST_PGBOUNCER when set). Without one the test is skipped, except
// when CI=true, where a missing pgbouncer is a failure.
func PgBouncerPath(tb testing.TB) string {
	tb.Helper()
	names := pgbouncerNames
	if p := os.Getenv("RATCHET_TEST_PGBOUNCER"); p != "" {
		names = []string{p}
	}
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		tb.Fatalf("pgbouncer is required when CI=true: none of %v found", names)
	}
	tb.Skipf("pgbouncer not found (tried %v); install Debian's pgbouncer or set RATCHET_TEST_PGBOUNCER", names)
	return ""
}

// StartPgBouncer starts pgbouncer in transaction mode in front of the server
// dbURL names (a URL from Postgres) and returns it; URL is dbURL with the
// host and port of the pooler, nothing else changed. The pooler forwards any
// database name, so a test can also reach other databases of the same server
// through it (URLFor). Authentication is trust on the client side; the
// password of dbURL, if any, is the one pgbouncer logs in with.
//
// pgbouncer refuses to run as root: under root (CI) it is started with
// -u nobody and its directory is made readable to that user.
func StartPgBouncer(tb testing.TB, dbURL string, o PgBouncerOptions) *PgBouncer {
	tb.Helper()
	bin := PgBouncerPath(tb)
	u, err := url.Parse(dbURL)
	if err != nil {
		tb.Fatalf("pgbouncer: parse %s: %v", dbURL, err)
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		host = "127.0.0.1"
	}
	if port == "" {
		port = "5432"
	}
	userName := u.User.Username()
	if userName == "" {
		userName = "postgres"
	}
	password, _ := u.User.Password()

	// Not tb.TempDir: its parent is private to the test's user, and
	// pgbouncer under root runs as nobody.
	dir, err := os.MkdirTemp("", "pgbouncer")
	if err != nil {
		tb.Fatalf("pgbouncer: %v", err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	b := &PgBouncer{bin: bin, dir: dir, ini: filepath.Join(dir, "pgbouncer.ini"), log: &Buffer{}}
	b.port = freePort(tb)
	poolSize := o.PoolSize
	if poolSize <= 0 {
		poolSize = 4
	}
	queryWait := 120
	if o.QueryWait > 0 {
		queryWait = max(1, int(o.QueryWait.Seconds()))
	}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pidfile = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 1000
query_wait_timeout = %d
admin_users = %s
stats_users = %s
ignore_startup_parameters = extra_float_digits
`, host, port, b.port, filepath.Join(dir, "users.txt"), filepath.Join(dir, "pgbouncer.pid"),
		poolSize, queryWait, userName, userName)
	users := fmt.Sprintf("%q %q\n", userName, password)
	if err := os.WriteFile(b.ini, []byte(ini), 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(users), 0o644); err != nil {
		tb.Fatal(err)
	}
	if os.Geteuid() == 0 {
		// pgbouncer drops to nobody before it writes its pidfile and
		// rereads its files on RELOAD.
		if nobody, err := user.Lookup("nobody"); err == nil {
			uid, _ := strconv.Atoi(nobody.Uid)
			gid, _ := strconv.Atoi(nobody.Gid)
			for _, p := range []string{dir, b.ini, filepath.Join(dir, "users.txt")} {
				if err := os.Chown(p, uid, gid); err != nil {
					tb.Fatalf("pgbouncer: chown %s: %v", p, err)
				}
			}
		}
	}
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port))
	b.url = u.String()
	tb.Cleanup(func() {
		b.Stop(tb)
		if tb.Failed() {
			tb.Logf("pgbouncer log:\n%s", tail(b.log.String(), 40))
		}
	})
	b.Start(tb)
	return b
}

// URL returns the test database's URL through the pooler.
func (b *PgBouncer) URL() string { return b.url }

// URLFor returns the URL of database name on the same server, through the
// pooler.
func (b *PgBouncer) URLFor(name string) string {
	u, _ := url.Parse(b.url)
	u.Path = "/" + name
	return u.String()
}

// Addr returns the pooler's host:port.
func (b *PgBouncer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// Log returns what pgbouncer has logged so far, across restarts.
func (b *PgBouncer) Log() string { return b.log.String() }

// Start starts the pooler (again, after Stop or Kill) on the same port and
// waits until it accepts connections. It fails the test when pgbouncer exits
// or does not listen within 15 seconds.
func (b *PgBouncer) Start(tb testing.TB) {
	tb.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd != nil {
		tb.Fatal("pgbouncer: Start while running")
	}
	args := []string{b.ini}
	if os.Geteuid() == 0 {
		args = []string{"-u", "nobody", b.ini}
	}
	// The pidfile of a killed pgbouncer would make the next one refuse to
	// start.
	_ = os.Remove(filepath.Join(b.dir, "pgbouncer.pid"))
	cmd := exec.Command(b.bin, args...)
	cmd.Stdout, cmd.Stderr = b.log, b.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlives the test binary
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start pgbouncer: %v", err)
	}
	done := make(chan struct{})
	go func() { // ends when pgbouncer exits: Stop, Kill, or by itself
		_ = cmd.Wait()
		close(done)
	}()
	b.cmd, b.done = cmd, done
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", b.Addr(), time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-done:
			b.cmd = nil
			tb.Fatalf("pgbouncer exited at start:\n%s", tail(b.log.String(), 20))
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("pgbouncer did not listen on %s within 15s:\n%s", b.Addr(), tail(b.log.String(), 20))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop shuts the pooler down at once (SIGTERM: every client and server
// connection is closed) and waits for it to exit. It does nothing when it is
// not running.
func (b *PgBouncer) Stop(tb testing.TB) {
	tb.Helper()
	b.signal(tb, syscall.SIGTERM)
}

// Kill kills the pooler with SIGKILL and waits for it to exit.
func (b *PgBouncer) Kill(tb testing.TB) {
	tb.Helper()
	b.signal(tb, syscall.SIGKILL)
}

// Restart stops the pooler and starts it again on the same port: every
// client sees its connection cut, and the next connect succeeds.
func (b *PgBouncer) Restart(tb testing.TB) {
	tb.Helper()
	b.Stop(tb)
	b.Start(tb)
}

func (b *PgBouncer) signal(tb testing.TB, sig syscall.Signal) {
	tb.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil {
		return
	}
	_ = b.cmd.Process.Signal(sig)
	select {
	case <-b.done:
	case <-time.After(15 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.done
		tb.Errorf("pgbouncer did not exit within 15s of %v", sig)
	}
	b.cmd, b.done = nil, nil
}

// Admin runs a command on pgbouncer's admin console (SHOW POOLS, KILL db,
// PAUSE, RESUME, RECONNECT ...) and returns the rows as text. The console
// speaks only the simple query protocol.
func (b *PgBouncer) Admin(tb testing.TB, command string) [][]string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(b.URLFor("pgbouncer"))
	if err != nil {
		tb.Fatalf("pgbouncer admin: %v", err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	delete(cfg.RuntimeParams, "application_name")
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("pgbouncer admin connect: %v", err)
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, command)
	if err != nil {
		tb.Fatalf("pgbouncer admin %q: %v", command, err)
	}
	defer rows.Close()
	var out [][]string
	for rows.Next() {
		vals := rows.RawValues()
		row := make([]string, len(vals))
		for i, v := range vals {
			row[i] = string(v)
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		tb.Fatalf("pgbouncer admin %q: %v", command, err)
	}
	return out
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
