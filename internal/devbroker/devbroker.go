// Package devbroker runs the local Kafka-protocol broker behind
// `ratchet broker` and `ratchet dev`. It is a single kfake broker
// (github.com/twmb/franz-go/pkg/kfake) in the current process: librdkafka
// talks to it over TCP like to any Kafka broker.
//
// kfake binds and advertises 127.0.0.1 only, so the broker is reachable from
// this machine and nowhere else (not from other containers either). Without
// a data directory everything is lost on Close; with one, topics, records and
// committed offsets survive a restart on the same address.
package devbroker

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
)

// DefaultAddr is the address the broker listens on when Options.Addr is
// empty: the usual Kafka port, so the default `kafka.brokers` reaches it.
const DefaultAddr = "127.0.0.1:9092"

// DefaultPartitions is the partition count of seeded and auto-created topics
// when Options.Partitions is zero.
const DefaultPartitions int32 = 12

// Options configure Start. The zero value is a usable in-memory broker on
// DefaultAddr.
type Options struct {
	// Addr is host:port to listen on. The host must be a loopback name
	// (127.0.0.1, localhost or empty); port 0 picks any free port, which
	// Broker.Addr reports. Empty means DefaultAddr.
	Addr string
	// Topics are created at start with Partitions partitions each, unless
	// they already exist in DataDir. Other topics are created on first use
	// when the client asks for auto-creation.
	Topics []string
	// Partitions is the partition count of new topics; 0 means
	// DefaultPartitions.
	Partitions int32
	// DataDir, when set, makes the broker persistent: state is loaded from
	// it at start and written to it on Close.
	DataDir string
	// Logger receives kfake's warnings and errors; nil means slog.Default().
	Logger *slog.Logger
}

// Broker is a running local broker. Its methods are safe for concurrent use.
type Broker struct {
	cluster   *kfake.Cluster
	addr      string
	closeOnce sync.Once
}

// Start validates opts, starts the broker and returns once it accepts
// connections. A port that is already taken gives an error naming the
// address; a non-loopback host is refused before anything is bound.
func Start(opts Options) (*Broker, error) {
	addr := opts.Addr
	if addr == "" {
		addr = DefaultAddr
	}
	port, err := loopbackPort(addr)
	if err != nil {
		return nil, err
	}
	parts := opts.Partitions
	if parts == 0 {
		parts = DefaultPartitions
	}
	if parts < 0 {
		return nil, fmt.Errorf("broker partitions %d: must be positive", parts)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}

	kopts := []kfake.Opt{
		kfake.Ports(port),
		kfake.DefaultNumPartitions(int(parts)),
		kfake.AllowAutoTopicCreation(),
		kfake.WithLogger(slogLogger{log: log}),
	}
	if len(opts.Topics) > 0 {
		kopts = append(kopts, kfake.SeedTopics(parts, opts.Topics...))
	}
	if opts.DataDir != "" {
		kopts = append(kopts, kfake.DataDir(opts.DataDir))
	}
	c, err := kfake.NewCluster(kopts...)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("start broker: address %s already in use (another broker running? choose another port): %w", addr, err)
		}
		return nil, fmt.Errorf("start broker on %s: %w", addr, err)
	}
	// State loaded from DataDir skips the seed topics entirely, so topics
	// asked for now but not persisted before are created here. Persisted
	// topics keep their partitions and records.
	for _, t := range opts.Topics {
		if c.TopicInfo(t) != nil {
			continue
		}
		if err := c.CreateTopic(t, parts, nil); err != nil {
			c.Close()
			return nil, fmt.Errorf("create topic %s: %w", t, err)
		}
	}
	addrs := c.ListenAddrs()
	if len(addrs) == 0 {
		c.Close()
		return nil, errors.New("start broker: kfake has no listen address")
	}
	return &Broker{cluster: c, addr: addrs[0]}, nil
}

// Addr returns the host:port the broker is listening on, with the real port
// when Options.Addr asked for port 0. Use it as bootstrap.servers.
func (b *Broker) Addr() string { return b.addr }

// Cluster returns the underlying kfake cluster, for tests that inject faults
// or inspect groups and partitions.
func (b *Broker) Cluster() *kfake.Cluster { return b.cluster }

// Close stops the broker: it closes the listener and every client
// connection and, with a data directory, flushes pending offset commits and
// writes the state to disk before returning. Calling Close again does
// nothing.
func (b *Broker) Close() {
	b.closeOnce.Do(b.cluster.Close)
}

// loopbackPort checks that addr names a loopback host kfake can serve and
// returns its port.
func loopbackPort(addr string) (int, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, fmt.Errorf("broker address %q: %w", addr, err)
	}
	switch host {
	case "", "127.0.0.1", "localhost":
	default:
		return 0, fmt.Errorf("broker address %q: the local broker (kfake) listens on 127.0.0.1 only; use 127.0.0.1:<port> or localhost:<port>", addr)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return 0, fmt.Errorf("broker address %q: port must be a number from 0 to 65535", addr)
	}
	return port, nil
}

// slogLogger adapts kfake's printf-style logger to slog. Only warnings and
// errors pass: kfake logs every request at info and debug.
type slogLogger struct {
	log *slog.Logger
}

// Logf implements kfake.Logger.
func (l slogLogger) Logf(level kfake.LogLevel, format string, args ...any) {
	switch level {
	case kfake.LogLevelError:
		l.log.Error("broker error", "component", "kfake", "detail", fmt.Sprintf(format, args...))
	case kfake.LogLevelWarn:
		l.log.Warn("broker warning", "component", "kfake", "detail", fmt.Sprintf(format, args...))
	}
}
