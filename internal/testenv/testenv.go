// Package testenv gives integration tests their real dependencies: a fresh
// PostgreSQL database per test and an in-process Kafka-protocol broker
// (kfake). Without PostgreSQL a test is skipped, except when CI=true, where a
// missing PostgreSQL is a failure: CI must never go green by skipping.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
)

// AdminURL is the PostgreSQL server tests create their databases on. It is
// RATCHET_TEST_POSTGRES_URL when set.
func AdminURL() string {
	if u := os.Getenv("RATCHET_TEST_POSTGRES_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

// ConnectAdmin connects to AdminURL. Without PostgreSQL it skips the test,
// or fails it when CI=true; every test that needs the server goes through
// it (or Postgres), so none can skip its way to a green CI.
func ConnectAdmin(ctx context.Context, tb testing.TB) *pgx.Conn {
	tb.Helper()
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("PostgreSQL is required when CI=true: %v", err)
		}
		tb.Skipf("PostgreSQL not reachable (%v); set RATCHET_TEST_POSTGRES_URL", err)
	}
	return admin
}

// Postgres creates an empty database for this test and returns its URL. The
// database is dropped when the test ends.
func Postgres(tb testing.TB) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	admin := ConnectAdmin(ctx, tb)
	defer admin.Close(ctx)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "ratchet_test_" + hex.EncodeToString(b)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("create database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, AdminURL())
		if err != nil {
			tb.Logf("drop database %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			tb.Logf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(AdminURL())
	if err != nil {
		tb.Fatalf("parse %s: %v", AdminURL(), err)
	}
	u.Path = "/" + name
	return u.String()
}

// Kafka starts an in-process kfake cluster with one broker and the given
// topics, each with partitions partitions, and returns it and its bootstrap
// address. The cluster is closed when the test ends.
func Kafka(tb testing.TB, partitions int32, topics ...string) (*kfake.Cluster, string) {
	tb.Helper()
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.AllowAutoTopicCreation()}
	if len(topics) > 0 {
		opts = append(opts, kfake.SeedTopics(partitions, topics...))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		tb.Fatalf("start kfake: %v", err)
	}
	tb.Cleanup(c.Close)
	addrs := c.ListenAddrs()
	if len(addrs) == 0 {
		tb.Fatal("kfake has no listen address")
	}
	return c, addrs[0]
}

// Eventually polls cond every 20ms until it returns true or timeout passes,
// then fails the test with msg.
func Eventually(tb testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("condition not met within %s: %s", timeout, fmt.Sprintf(format, args...))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// MockKafka starts librdkafka's own mock cluster (a second, independent
// Kafka-protocol implementation) in this process with the given topics and
// returns its bootstrap address; other processes reach it over TCP. It is
// closed when the test ends.
//
// Use it where kfake's group coordinator falls short: kfake restarts the
// join deadline on every JoinGroup, so a group whose members keep being
// killed and restarted can stay in rebalance for ever.
func MockKafka(tb testing.TB, partitions int, topics ...string) string {
	tb.Helper()
	_, addr := MockKafkaCluster(tb, partitions, topics...)
	return addr
}

// MockKafkaCluster is MockKafka that also returns the cluster, for tests
// that inject faults into it (DelayMockRequest).
func MockKafkaCluster(tb testing.TB, partitions int, topics ...string) (*kafka.MockCluster, string) {
	tb.Helper()
	mc, err := kafka.NewMockCluster(1)
	if err != nil {
		tb.Fatalf("start mock cluster: %v", err)
	}
	tb.Cleanup(mc.Close)
	for _, t := range topics {
		if err := mc.CreateTopic(t, partitions, 1); err != nil {
			tb.Fatalf("mock cluster topic %s: %v", t, err)
		}
	}
	return mc, mc.BootstrapServers()
}
