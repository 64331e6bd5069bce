package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/internal/store"
)

// broker is a `ratchet broker` subprocess.
type broker struct {
	cmd  *exec.Cmd
	addr string
	done chan error
}

// startBroker runs `ratchet broker` on a free loopback port with topics
// (12 partitions each) and returns once it listens.
func startBroker(ctx context.Context, bin string, topics []string, partitions int, logw io.Writer) (*broker, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cmd := exec.Command(bin, "broker", "-addr", addr, "-topics", strings.Join(topics, ","),
		"-partitions", fmt.Sprint(partitions))
	cmd.Stderr = logw
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("broker stdout: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start broker: %w", err)
	}
	b := &broker{cmd: cmd, addr: addr, done: make(chan error, 1)}
	ready := make(chan struct{})
	go func() { // ends when the broker closes its stdout
		sc := bufio.NewScanner(out)
		once := false
		for sc.Scan() {
			if !once && strings.Contains(sc.Text(), "broker listening") {
				once = true
				close(ready)
			}
		}
	}()
	go func() { b.done <- cmd.Wait() }() // ends when the broker exits
	select {
	case <-ready:
		return b, nil
	case err := <-b.done:
		return nil, fmt.Errorf("broker exited at start: %v", err)
	case <-time.After(30 * time.Second):
		b.stop()
		return nil, fmt.Errorf("broker did not listen within 30s")
	case <-ctx.Done():
		b.stop()
		return nil, ctx.Err()
	}
}

// rssMiB returns the broker's current resident set in MiB.
func (b *broker) rssMiB() float64 {
	v, _ := procStatusKiB(b.cmd.Process.Pid, "VmRSS")
	return float64(v) / 1024
}

func (b *broker) stop() {
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.done
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// procStatusKiB reads a "Vm...: N kB" line of /proc/<pid>/status.
func procStatusKiB(pid int, key string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, key+":") {
			var v int64
			_, err := fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(line, key+":")), "%d", &v)
			return v, err
		}
	}
	return 0, fmt.Errorf("%s not in /proc/%d/status", key, pid)
}

// database is a fresh PostgreSQL database for one run.
type database struct {
	admin string
	name  string
	url   string
	pool  *pgxpool.Pool
}

// createDatabase creates a fresh, migrated database on the server of admin
// (a URL of an existing database such as postgres).
func createDatabase(ctx context.Context, admin string) (*database, error) {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", admin, err)
	}
	defer conn.Close(ctx)
	name := fmt.Sprintf("ratchet_bench_%d_%d", os.Getpid(), time.Now().Unix())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, fmt.Errorf("create database %s: %w", name, err)
	}
	cfg, err := pgx.ParseConfig(admin)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", admin, err)
	}
	url := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, name)
	d := &database{admin: admin, name: name, url: url}
	pool, err := store.Open(ctx, url, 8)
	if err != nil {
		d.drop(ctx)
		return nil, err
	}
	d.pool = pool
	if err := store.Migrate(ctx, pool); err != nil {
		d.drop(ctx)
		return nil, err
	}
	return d, nil
}

func (d *database) drop(ctx context.Context) {
	if d.pool != nil {
		d.pool.Close()
	}
	conn, err := pgx.Connect(ctx, d.admin)
	if err != nil {
		slog.Warn("drop database: connect", "err", err)
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+d.name+" WITH (FORCE)"); err != nil {
		slog.Warn("drop database", "name", d.name, "err", err)
	}
}

// storedSum returns the sum of the stored offsets of group on topic.
func (d *database) storedSum(ctx context.Context, group, topic string) (int64, error) {
	var n int64
	err := d.pool.QueryRow(ctx, `SELECT coalesce(sum(next_offset),0)::bigint FROM ratchet_offsets
		WHERE consumer_group=$1 AND topic=$2`, group, topic).Scan(&n)
	return n, err
}
