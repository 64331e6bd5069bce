// Package chaos is the chaos explorer: it draws a schedule of overlapping
// faults from a seed (internal/chaos), carries it out against real
// `ratchet run` processes — static and dynamic members of one group, a
// test broker (kfake) with request faults, PostgreSQL behind a proxy that
// cuts and slows connections — while a producer writes at a steady rate
// with 1 % poison, and checks the invariants after the run. Some seeds run
// configured pipelines instead of the built-in processor, with a second,
// JSON topic of bad records beside the events (pipelines_test.go). A failure
// prints the seed, the schedule, what happened when, the invariant broken
// with its numbers and where the logs are; CHAOS_SEED=N replays it.
//
//	make chaos                       20 seeds of 90 s (CHAOS_SEEDS, CHAOS_DURATION)
//	CHAOS_SEED=7 make chaos          seed 7 alone
//	CHAOS_FIRST_SEED=21 make chaos   seeds 21–40
//
// Without these variables (make test, CI) it runs a short pass: seeds 1
// and 2 (one of each commit mode) for 60 s each.
package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"ratchet/config"
	"ratchet/internal/chaos"
	"ratchet/internal/event"
	"ratchet/internal/produce"
	"ratchet/internal/schemareg"
	"ratchet/internal/store"
	"ratchet/internal/testenv"
)

const (
	topic    = "events"
	dlqTopic = "events.dlq"
	group    = "ratchet"
	// commitInterval is the members' commit.interval; it bounds what an
	// at-least-once member that dies without a word can leave to replay.
	commitInterval = time.Second
	// livenessBound is how long after the last fault everything produced
	// must be applied (plus the session timeout when a static member left
	// for good, whose partitions wait for it).
	livenessBound = 30 * time.Second
)

// seeds returns the seeds to run and the load of each, from the
// environment (see the package comment).
func seeds(t *testing.T) ([]uint64, time.Duration) {
	load := 60 * time.Second
	if v := os.Getenv("CHAOS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 10*time.Second {
			t.Fatalf("CHAOS_DURATION=%q: want a Go duration of at least 10s", v)
		}
		load = d
	}
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: want a whole number", v)
		}
		return []uint64{s}, load
	}
	n, first := 2, uint64(1)
	if v := os.Getenv("CHAOS_SEEDS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("CHAOS_SEEDS=%q: want a count of at least 1", v)
		}
	}
	if v := os.Getenv("CHAOS_FIRST_SEED"); v != "" {
		var err error
		if first, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("CHAOS_FIRST_SEED=%q: want a whole number", v)
		}
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = first + uint64(i)
	}
	return out, load
}

func TestExplore(t *testing.T) {
	list, load := seeds(t)
	// The chaos build is `ratchet` itself unless RATCHET_CHAOS_* asks its
	// processor to panic (internal/chaos/panic.go).
	bin := testenv.BuildPanicky(t, "")
	for _, seed := range list {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			explore(t, bin, chaos.Plan(seed, load))
		})
	}
}

// rec is one record the producer wrote, as its delivery report told.
type rec struct {
	partition int32
	offset    int64
	poison    bool
	metric    string
	bucket    time.Time
	value     float64
}

type groupReq struct {
	key kmsg.Key
	at  time.Time
}

type bucketKey struct {
	metric string
	bucket time.Time
}

type agg struct {
	count int64
	sum   float64
}

// member is one slot of the schedule (m0, m1, …) and the process that
// currently fills it.
type member struct {
	idx         int
	static      bool
	mu          sync.Mutex // held while the slot's process is changed
	proc        *testenv.Process
	incarnation int
	stopping    bool // the explorer is stopping this process: its exit is explained
	gone        bool // scaled down for good
}

// run is one seed's run.
type run struct {
	t       *testing.T
	s       chaos.Schedule
	bin     string
	dir     string
	cluster *kfake.Cluster
	addr    string
	// registry serves the topic's schema when the schedule asks for the
	// registry's wire format; frame is what the producer puts before
	// each value.
	registry *testenv.Registry
	frame    []byte
	dbURL    string
	proxy    *testenv.Proxy
	pool     *pgxpool.Pool // direct, for the checks and the resets
	start    time.Time
	members  []*member

	mu         sync.Mutex
	journal    []string
	violations []string
	delivered  []rec
	failedSend int
	// configPath is the members' configuration file in a pipeline run
	// (empty otherwise); orders are the JSON records delivered to its
	// second topic (pipelines_test.go).
	configPath   string
	orders       []order
	failedOrders int
	// extra counts, per partition and offset, the times an offsets reset
	// made a record due once more (exactly-once: it is applied again).
	extra map[int32]map[int64]int
	// lastGroupReq is, per member (instance id, or client id for a
	// dynamic member), the last group request the broker received from it
	// and when: what tells a member the broker dropped while it waited in
	// JoinGroup from one that never asked.
	lastGroupReq map[string]groupReq
	// silentLosses counts the faults after which an at-least-once member
	// could not announce what it leaves to replay (SIGKILL, a pause past
	// the session timeout); silentBound adds up, for each, what the group
	// had not committed at that moment: the most such a member can leave
	// to replay, its batches in flight included (a transaction it pipelined
	// may still commit after it died, once a lock it waits on is gone).
	silentLosses int
	silentBound  int64
	// preparing is when the group last entered its join phase
	// (PreparingRebalance) at preparingGen; zero while it is not in it.
	preparing    time.Time
	preparingGen int32
	groupTrace   []string
}

func (r *run) note(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.journal = append(r.journal, fmt.Sprintf("%8s  %s", time.Since(r.start).Round(time.Millisecond), fmt.Sprintf(format, args...)))
}

func (r *run) violate(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.violations = append(r.violations, fmt.Sprintf(format, args...))
}

func explore(t *testing.T, bin string, s chaos.Schedule) {
	dir, err := os.MkdirTemp("", fmt.Sprintf("ratchet-chaos-seed-%d-", s.Seed))
	if err != nil {
		t.Fatal(err)
	}
	r := &run{t: t, s: s, bin: bin, dir: dir, extra: map[int32]map[int64]int{}, lastGroupReq: map[string]groupReq{}}
	topics := []string{topic, dlqTopic}
	if s.Pipelines {
		topics = append(topics, ordersTopic, ordersDLQ)
	}
	r.cluster, r.addr = testenv.Kafka(t, s.Partitions, topics...)
	r.cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.JoinGroup, kmsg.SyncGroup, kmsg.Heartbeat, kmsg.LeaveGroup},
		Observe: true, Count: -1, When: r.observeGroup})
	r.dbURL = testenv.Postgres(t)
	r.proxy = testenv.NewProxy(t, "127.0.0.1:5432")
	if s.Registry {
		r.registry = testenv.NewRegistry(t, "", "")
		r.frame, _, err = schemareg.RegisterEvent(config.SchemaRegistry{URL: config.SecretURL(r.registry.URL())}, topic, event.FormatProtobuf)
		if err != nil {
			t.Fatalf("register the event schema: %v", err)
		}
	}
	r.pool, err = pgxpool.New(context.Background(), r.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.pool.Close)
	t.Cleanup(func() { r.report(t) })
	if s.Pipelines {
		r.setUpPipelines()
	}

	r.start = time.Now()
	for i, m := range s.Members {
		r.members = append(r.members, &member{idx: i, static: m.Static})
	}
	for i := range min(3, len(r.members)) {
		r.startMember(r.members[i])
	}

	// The load and the faults run side by side; each fault is a goroutine
	// that waits for its moment, acts, waits for its duration and undoes.
	var wg sync.WaitGroup
	watching := make(chan struct{})
	var watched sync.WaitGroup
	watched.Go(func() { r.watchCommits(watching) }) // ends when watching is closed, after the final stop
	defer func() { close(watching); watched.Wait() }()
	wg.Go(r.produce)
	if s.Pipelines {
		wg.Go(r.produceOrders)
	}
	for _, f := range s.Faults {
		wg.Go(func() { r.inject(f) })
	}
	wg.Wait()
	calm := time.Now()
	r.note("load and faults over")

	bound := livenessBound
	if s.StaticLeftForGood() {
		bound += s.SessionTimeout
	}
	if !r.waitApplied(bound) {
		r.diagnoseStall(bound)
	} else {
		r.note("everything applied %s after the last fault", time.Since(calm).Round(100*time.Millisecond))
		r.checkIdle()
	}
	r.stopAll()
	r.check()
	r.mu.Lock()
	_ = os.WriteFile(filepath.Join(dir, "group-trace.log"), []byte(strings.Join(r.groupTrace, "")), 0o644)
	r.mu.Unlock()
	if len(r.violations) == 0 && os.Getenv("CHAOS_KEEP_LOGS") == "" {
		_ = os.RemoveAll(dir)
	}
}

// logLevel is the members' log level: info, or CHAOS_LOG_LEVEL (debug
// logs every applied batch, to account for a replay offset by offset).
func logLevel() string {
	if l := os.Getenv("CHAOS_LOG_LEVEL"); l != "" {
		return l
	}
	return "info"
}

// rebalanceTimeout is the members' max.poll.interval.ms, which librdkafka
// sends as the rebalance timeout: the longest a group may stay in its join
// phase on Apache Kafka.
const rebalanceTimeout = 20 * time.Second

// env is the environment of member m's process.
func (r *run) env(m *member) []string {
	proxied := strings.Replace(r.dbURL, "127.0.0.1:5432", r.proxy.Addr(), 1)
	props := fmt.Sprintf("session.timeout.ms=%d,heartbeat.interval.ms=500,max.poll.interval.ms=%d,client.id=m%d-%d",
		r.s.SessionTimeout.Milliseconds(), rebalanceTimeout.Milliseconds(), m.idx, m.incarnation)
	env := []string{
		"RATCHET_KAFKA_BROKERS=" + r.addr, "RATCHET_POSTGRES_URL=" + proxied,
		"RATCHET_COMMIT_MODE=" + r.s.Mode, "RATCHET_COMMIT_INTERVAL=" + commitInterval.String(),
		"RATCHET_SHUTDOWN_TIMEOUT=" + r.s.ShutdownTimeout.String(), "RATCHET_RETRY_MAX_BACKOFF=2s",
		"RATCHET_KAFKA_PROPERTIES=" + props, "RATCHET_LOG_LEVEL=" + logLevel(), "RATCHET_KAFKA_INSTANCE_ID=",
	}
	if m.static {
		env = append(env, fmt.Sprintf("RATCHET_KAFKA_INSTANCE_ID=m%d", m.idx))
	}
	if r.registry != nil {
		env = append(env, "RATCHET_SCHEMA_REGISTRY_URL="+r.registry.URL())
	}
	if r.s.PanicEvery > 0 {
		// Room for the planned panics in the restart budget: a run of
		// them must not make the member give up (exit 1, as documented).
		env = append(env, fmt.Sprintf("%s=%d", chaos.EnvPanicEvery, r.s.PanicEvery), "RATCHET_SUPERVISION_MAX_RESTARTS=100")
	}
	return env
}

// startMember starts a new process in m's slot and watches its exit: an
// exit the explorer did not cause is a violation.
func (r *run) startMember(m *member) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.incarnation++
	m.stopping = false
	name := fmt.Sprintf("m%d-%d", m.idx, m.incarnation)
	var args []string
	if r.configPath != "" {
		args = []string{"run", "--config", r.configPath}
	}
	p := testenv.StartProcess(r.t, r.bin, testenv.ProcessOptions{Name: name, Args: args, Env: r.env(m), LogDir: r.dir, HTTP: true})
	m.proc = p
	r.note("start %s (pid %d)", name, p.Pid())
	go func() { // ends when the process exits
		<-p.Exited()
		m.mu.Lock()
		explained := m.stopping || m.proc != p
		m.mu.Unlock()
		if !explained {
			r.violate("%s exited on its own (exit code %d); log %s", name, p.ExitCode(), p.LogPath)
			r.note("%s exited on its own, code %d", name, p.ExitCode())
		}
	}()
}

// stopMember stops m's process: SIGKILL, or SIGTERM that must end within
// shutdown.timeout (plus a second for the process to exit) with code 0.
func (r *run) stopMember(m *member, kill bool) {
	m.mu.Lock()
	p := m.proc
	m.stopping = true
	m.mu.Unlock()
	if p == nil || !p.Running() {
		return
	}
	if kill {
		p.Kill()
		r.note("killed %s", p.Name)
		return
	}
	limit := r.s.ShutdownTimeout + time.Second
	took, inTime := p.Term(limit + 10*time.Second)
	r.note("%s stopped after SIGTERM in %s (exit code %d)", p.Name, took.Round(time.Millisecond), p.ExitCode())
	if !inTime || took > limit {
		r.violate("%s took %s to stop after SIGTERM, over shutdown.timeout %s + 1s; log %s", p.Name, took.Round(time.Millisecond), r.s.ShutdownTimeout, p.LogPath)
	} else if code := p.ExitCode(); code != 0 {
		r.violate("%s exited %d after SIGTERM, want 0; log %s", p.Name, code, p.LogPath)
	}
}

// produce writes the schedule's load: Rate events a second for Load, 1 %
// poison, every delivery recorded with its partition and offset.
func (r *run) produce() {
	opts := produce.Options{Seed: int64(r.s.Seed), Format: event.FormatProtobuf, PoisonFraction: r.s.Poison,
		// Event times spread over 30 days of minute buckets: with five
		// metrics almost every record has a rollup row of its own, so the
		// per-bucket counts check nearly record by record, and a replay
		// in one bucket cannot hide a loss in another.
		TimeSpread: 30 * 24 * time.Hour, Now: func() time.Time { return time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC) }}
	g := produce.NewGenerator(opts)
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": r.addr, "linger.ms": 5,
		"enable.idempotence": true, "acks": "all", "log_level": 3})
	if err != nil {
		r.violate("producer: %v", err)
		return
	}
	defer p.Close()
	deliveries := make(chan kafka.Event, 4096)
	var drained sync.WaitGroup
	sent := 0
	var sentMu sync.Mutex
	drained.Go(func() { // ends when deliveries is closed
		for e := range deliveries {
			m, ok := e.(*kafka.Message)
			if !ok {
				continue
			}
			rc := m.Opaque.(rec)
			r.mu.Lock()
			if m.TopicPartition.Error != nil {
				r.failedSend++
			} else {
				rc.partition, rc.offset = m.TopicPartition.Partition, int64(m.TopicPartition.Offset)
				r.delivered = append(r.delivered, rc)
			}
			r.mu.Unlock()
		}
	})
	t := topic
	tick := 20 * time.Millisecond
	perTick := float64(r.s.Rate) * tick.Seconds()
	ticker := time.NewTicker(tick) // pacing of the load
	defer ticker.Stop()
	end := r.start.Add(r.s.Load)
	owed := 0.0
	for now := range ticker.C {
		if now.After(end) {
			break
		}
		owed += perTick
		for ; owed >= 1; owed-- {
			k, v, ev, poison := g.Next()
			if len(r.frame) > 0 { // poison is framed too: refused for what it carries
				v = append(r.frame[:len(r.frame):len(r.frame)], v...)
			}
			rc := rec{poison: poison}
			if ev != nil {
				rc.metric, rc.value = ev.Metric, ev.Value
				rc.bucket = ev.Time.AsTime().UTC().Truncate(time.Minute)
			}
			for p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &t, Partition: kafka.PartitionAny},
				Key: k, Value: v, Opaque: rc}, deliveries) != nil {
				p.Flush(50)
			}
			sentMu.Lock()
			sent++
			sentMu.Unlock()
		}
	}
	for p.Flush(1000) > 0 {
	}
	// Every produced record has its delivery report once Flush returns 0.
	for {
		r.mu.Lock()
		got := len(r.delivered) + r.failedSend
		r.mu.Unlock()
		if got >= sent {
			break
		}
		time.Sleep(10 * time.Millisecond) // the reports in the channel are being read
	}
	close(deliveries)
	drained.Wait()
	r.note("producer done: %d records, %d failed deliveries", sent, r.failedSend)
}

// inject carries out one fault at its moment.
func (r *run) inject(f chaos.Fault) {
	time.Sleep(time.Until(r.start.Add(f.At))) // the fault's moment in the schedule
	r.note("fault: %s", f)
	switch f.Kind {
	case chaos.Kill, chaos.Term:
		m := r.members[f.Target]
		r.stopMember(m, f.Kind == chaos.Kill)
		if f.Kind == chaos.Kill && r.s.Mode == chaos.AtLeastOnce {
			r.silentLoss()
		}
		time.Sleep(f.Duration) // the pod is away
		r.startMember(m)
	case chaos.Pause:
		m := r.members[f.Target]
		m.mu.Lock()
		p := m.proc
		m.mu.Unlock()
		p.Signal(syscall.SIGSTOP)
		time.Sleep(f.Duration) // the process is frozen
		if f.Duration > r.s.SessionTimeout && r.s.Mode == chaos.AtLeastOnce {
			r.silentLoss() // measured while it is still frozen
		}
		p.Signal(syscall.SIGCONT)
		r.note("resumed %s after %s", p.Name, f.Duration.Round(time.Millisecond))
	case chaos.ScaleUp:
		r.startMember(r.members[f.Target])
	case chaos.ScaleDown:
		m := r.members[f.Target]
		r.stopMember(m, false)
		m.mu.Lock()
		m.gone = true
		m.mu.Unlock()
	case chaos.PostgresCut:
		r.proxy.Cut()
		time.Sleep(f.Duration) // the outage
		r.proxy.Restore()
		r.note("postgres restored")
	case chaos.PostgresSlow:
		r.proxy.Delay(f.Delay)
		time.Sleep(f.Duration) // the slow spell
		r.proxy.Delay(0)
		r.note("postgres fast again")
	case chaos.PostgresLock:
		r.lockRollups(f.Duration)
	case chaos.PostgresTerminate:
		var n int
		err := r.pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'ratchet' AND pid <> pg_backend_pid()`).Scan(&n)
		r.note("terminated %d backends (err %v)", n, err)
	case chaos.BrokerFail:
		h := r.cluster.Fault(brokerFault(f.Request))
		time.Sleep(f.Duration) // the broker fails these requests meanwhile
		h.Remove()
		r.note("broker %s requests answer again (%d failed)", f.Request, h.Hits())
	case chaos.BrokerSlow:
		held := r.slowBroker(f)
		r.note("broker %s requests answer at once again (%d held)", f.Request, held)
	case chaos.Reset:
		r.reset(f)
	case chaos.RegistryOutage:
		r.registry.Fail(503)
		time.Sleep(f.Duration) // the registry is down
		r.registry.Fail(0)
		r.note("registry answers again")
	}
}

// watchCommits polls the group's committed offsets until stop is closed
// and records every move backwards: the group position only moves
// forward, except where an offsets reset moved it back on purpose.
func (r *run) watchCommits(stop <-chan struct{}) {
	last := map[int32]int64{}
	var lastState string
	tick := time.NewTicker(50 * time.Millisecond) // polling the broker's state
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		info := r.cluster.GroupInfo(group)
		if info == nil {
			continue
		}
		if state := fmt.Sprintf("%s generation %d members %v", info.State, info.Epoch, groupMembers(info)); state != lastState {
			r.trace("group %s", state)
			lastState = state
		}
		r.mu.Lock()
		switch {
		case info.State != "PreparingRebalance":
			r.preparing = time.Time{}
		case r.preparing.IsZero() || r.preparingGen != info.Epoch:
			r.preparing, r.preparingGen = time.Now(), info.Epoch
		}
		r.mu.Unlock()
		for p, c := range info.Commits[topic] {
			if prev, ok := last[p]; ok && c.Offset < prev {
				r.mu.Lock()
				reset := len(r.extra[p]) > 0
				r.mu.Unlock()
				if reset {
					r.note("committed offset of partition %d moved back from %d to %d after an offsets reset", p, prev, c.Offset)
				} else {
					r.note("committed offset of partition %d moved BACK from %d to %d", p, prev, c.Offset)
					if r.s.Mode == chaos.AtLeastOnce {
						r.violate("the committed offset of partition %d moved back from %d to %d (%d records to replay, announced by no one)", p, prev, c.Offset, prev-c.Offset)
					}
				}
			}
			last[p] = c.Offset
		}
	}
}

// groupMembers names the group's members as the broker lists them: client
// id (instance id) and member id.
func groupMembers(info *kfake.GroupInfo) []string {
	var out []string
	for _, m := range info.Members {
		name := m.ClientID
		if m.InstanceID != nil {
			name += "(" + *m.InstanceID + ")"
		}
		out = append(out, name+"="+m.MemberID)
	}
	slices.Sort(out)
	return out
}

// silentLoss records a member that cannot announce what it leaves to
// replay, with the group's uncommitted span at this moment: every record
// between Kafka's committed offset and the end of each partition.
func (r *run) silentLoss() {
	var span int64
	info := r.cluster.GroupInfo(group)
	topics := []string{topic}
	if r.s.Pipelines {
		topics = append(topics, ordersTopic)
	}
	for _, t := range topics {
		for _, p := range r.cluster.PartitionInfos(t) {
			from := p.LogStartOffset
			if info != nil {
				if c, ok := info.Commits[t][p.Partition]; ok {
					from = c.Offset
				}
			}
			span += max(0, p.HighWatermark-from)
		}
	}
	r.mu.Lock()
	r.silentLosses++
	r.silentBound += span
	r.mu.Unlock()
	r.note("silent loss: the group had %d records uncommitted", span)
}

// lockRollups holds an exclusive lock on dashboard_rollups for d, as a
// long migration or a report's lock would: the members' batches wait on it.
func (r *run) lockRollups(d time.Duration) {
	ctx := context.Background()
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		r.note("lock rollups: %v", err)
		return
	}
	defer tx.Rollback(ctx) //nolint:errcheck // ends the lock; nothing was written
	if _, err := tx.Exec(ctx, `LOCK TABLE dashboard_rollups IN EXCLUSIVE MODE`); err != nil {
		r.note("lock rollups: %v", err)
		return
	}
	time.Sleep(d) // the lock is held
	r.note("rollup lock released after %s", d.Round(time.Millisecond))
}

// slowBroker holds each request of f's kind for f.Delay before the broker
// answers it, until f is over, and returns how many it held. A held
// request yields to the other connections; requests after it on its own
// connection wait their turn, as they would behind a slow broker.
func (r *run) slowBroker(f chaos.Fault) int64 {
	key := map[string]kmsg.Key{chaos.RequestFetch: kmsg.Fetch, chaos.RequestCommit: kmsg.OffsetCommit,
		chaos.RequestJoin: kmsg.JoinGroup, chaos.RequestHeartbeat: kmsg.Heartbeat, chaos.RequestProduce: kmsg.Produce}[f.Request]
	end := time.Now().Add(f.Duration)
	var held atomic.Int64
	var mu sync.Mutex
	seen := map[kmsg.Request]bool{}
	r.cluster.ControlKey(int16(key), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if time.Now().After(end) {
			r.cluster.DropControl()
			return nil, nil, false
		}
		if p, ok := req.(*kmsg.ProduceRequest); ok && !slices.ContainsFunc(p.Topics, func(t kmsg.ProduceRequestTopic) bool { return t.Topic == dlqTopic }) {
			return nil, nil, false // only the dead-letter producer's, as BrokerFail
		}
		mu.Lock()
		first := !seen[req] // run again for the request it held: let it through
		seen[req] = true
		mu.Unlock()
		if first {
			held.Add(1)
			r.cluster.SleepControl(func() { time.Sleep(f.Delay) }) // the broker is slow to answer
		}
		return nil, nil, false // then answered as usual
	})
	time.Sleep(f.Duration) // requests are held meanwhile
	return held.Load()
}

// brokerFault is the kfake fault of a BrokerFail: retriable errors, as a
// broker under a partition move or a coordinator failover answers.
func brokerFault(request string) kfake.Fault {
	switch request {
	case chaos.RequestFetch:
		return kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Err: kerr.NotLeaderForPartition, Count: -1}
	case chaos.RequestCommit:
		return kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Err: kerr.CoordinatorLoadInProgress, Count: -1}
	case chaos.RequestJoin:
		return kfake.Fault{Keys: []kmsg.Key{kmsg.JoinGroup}, Err: kerr.CoordinatorLoadInProgress, Count: -1}
	case chaos.RequestHeartbeat:
		return kfake.Fault{Keys: []kmsg.Key{kmsg.Heartbeat}, Err: kerr.RebalanceInProgress, Count: -1}
	default: // produce: the dead-letter producer's
		return kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: dlqTopic, Err: kerr.NotEnoughReplicas, Count: -1}
	}
}

// reset moves a partition's stored position back by f.Shift, as `ratchet
// offsets reset --execute` does (the same store call), and records which
// records are due once more.
func (r *run) reset(f chaos.Fault) {
	ctx := context.Background()
	var epoch, next int64
	err := r.pool.QueryRow(ctx, `SELECT epoch, next_offset FROM ratchet_offsets WHERE consumer_group = $1 AND topic = $2 AND partition = $3`,
		group, topic, f.Partition).Scan(&epoch, &next)
	if err != nil {
		r.note("offsets reset skipped: partition %d has no stored position yet (%v)", f.Partition, err)
		return
	}
	to := max(0, next-f.Shift)
	res, err := store.ResetOffsets(ctx, r.pool, group, []store.OffsetMove{{Topic: topic, Partition: f.Partition, Epoch: epoch, From: next, To: to}})
	if err != nil {
		r.violate("offsets reset of partition %d: %v", f.Partition, err)
		return
	}
	m := res[0]
	if !m.Moved {
		r.note("offsets reset of partition %d not applied: claimed since (epoch %d, found %d)", f.Partition, m.FoundEpoch, m.FoundNext)
		return
	}
	r.mu.Lock()
	if r.extra[f.Partition] == nil {
		r.extra[f.Partition] = map[int64]int{}
	}
	for o := to; o < m.FoundNext; o++ {
		r.extra[f.Partition][o]++
	}
	r.mu.Unlock()
	r.note("offsets reset: partition %d from %d back to %d", f.Partition, m.FoundNext, to)
}

// expected returns the rollups every delivered good record makes, each
// counted as often as it is due, and the dead letters due per (partition,
// offset).
func (r *run) expected() (map[bucketKey]agg, map[[2]int64]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rollups := map[bucketKey]agg{}
	dead := map[[2]int64]int{}
	for _, rc := range r.delivered {
		times := 1 + r.extra[rc.partition][rc.offset]
		if rc.poison {
			dead[[2]int64{int64(rc.partition), rc.offset}] += times
			continue
		}
		k := bucketKey{rc.metric, rc.bucket}
		a := rollups[k]
		a.count += int64(times)
		a.sum += float64(times) * rc.value
		rollups[k] = a
	}
	return rollups, dead
}

func (r *run) rollups() (map[bucketKey]agg, error) {
	rows, err := r.pool.Query(context.Background(), `SELECT metric, bucket, count, sum FROM dashboard_rollups`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	got := map[bucketKey]agg{}
	for rows.Next() {
		var k bucketKey
		var a agg
		if err := rows.Scan(&k.metric, &k.bucket, &a.count, &a.sum); err != nil {
			return nil, err
		}
		k.bucket = k.bucket.UTC()
		got[k] = a
	}
	return got, rows.Err()
}

// covered reports whether got has at least what want asks in every bucket
// (exactly: no more, in exactly-once mode).
func covered(want, got map[bucketKey]agg, exact bool) bool {
	for k, w := range want {
		g := got[k]
		if g.count < w.count || (exact && g.count != w.count) {
			return false
		}
	}
	return true
}

// waitApplied waits until every good record is counted and the dead
// letters are all written, at most bound.
func (r *run) waitApplied(bound time.Duration) bool {
	want, dead := r.expected()
	wantDead := 0
	for _, n := range dead {
		wantDead += n
	}
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		got, err := r.rollups()
		if err == nil && covered(want, got, false) && r.dlqSize() >= int64(wantDead) && (!r.s.Pipelines || r.ordersCaughtUp()) {
			return true
		}
		time.Sleep(250 * time.Millisecond) // polling the database for the condition
	}
	return false
}

// dlqSize is the number of records in the dead-letter topic.
func (r *run) dlqSize() int64 {
	var n int64
	for _, p := range r.cluster.PartitionInfos(dlqTopic) {
		n += p.HighWatermark - p.LogStartOffset
	}
	return n
}

// observeGroup records a group request (on the broker's goroutine: it
// must not block).
func (r *run) observeGroup(req kmsg.Request) bool {
	var member string
	var instance *string
	var gen int32 = -1
	switch q := req.(type) {
	case *kmsg.JoinGroupRequest:
		member, instance = q.MemberID, q.InstanceID
	case *kmsg.SyncGroupRequest:
		member, instance, gen = q.MemberID, q.InstanceID, q.Generation
	case *kmsg.HeartbeatRequest:
		member, instance, gen = q.MemberID, q.InstanceID, q.Generation
	case *kmsg.LeaveGroupRequest:
		for _, m := range q.Members {
			r.trace("LeaveGroup member %s instance %v", m.MemberID, m.InstanceID)
		}
		return true
	default:
		return true
	}
	r.trace("%s member %q instance %v generation %d", kmsg.Key(req.Key()).Name(), member, instance, gen)
	who := memberKey(member, instance)
	if who == "" {
		return true
	}
	r.mu.Lock()
	r.lastGroupReq[who] = groupReq{key: kmsg.Key(req.Key()), at: time.Now()}
	r.mu.Unlock()
	return true
}

// trace adds a line to the run's group protocol trace (group-trace.log in
// the logs directory): every group request the broker received and every
// change of the group's state as the broker reports it.
func (r *run) trace(format string, args ...any) {
	line := fmt.Sprintf("%10s  %s\n", time.Since(r.start).Round(time.Millisecond), fmt.Sprintf(format, args...))
	r.mu.Lock()
	r.groupTrace = append(r.groupTrace, line)
	r.mu.Unlock()
}

// memberKey names a group member as the explorer names its processes:
// the instance id of a static member (m0), the client id of a dynamic one
// (m1-2, which the broker puts before the member id's uuid).
func memberKey(memberID string, instance *string) string {
	if instance != nil {
		return *instance
	}
	if i := strings.LastIndex(memberID, "-"); i > 0 && len(memberID)-i-1 >= 8 {
		// client id "mN-I", then "-" and a uuid that has dashes of its own:
		// keep the first two dash-separated parts.
		parts := strings.SplitN(memberID, "-", 3)
		if len(parts) == 3 {
			return parts[0] + "-" + parts[1]
		}
	}
	return ""
}

// diagnoseStall records a liveness violation with what tells a broker
// deviation from an engine failure: the group's state and members as the
// broker sees them, against the processes that are alive.
func (r *run) diagnoseStall(bound time.Duration) {
	want, _ := r.expected()
	got, _ := r.rollups()
	var missing int64
	for k, w := range want {
		missing += max(0, w.count-got[k].count)
	}
	info := r.cluster.GroupInfo(group)
	inGroup := map[string]bool{}
	var members []string
	if info != nil {
		for _, gm := range info.Members {
			k := gm.ClientID
			if gm.InstanceID != nil {
				k = *gm.InstanceID
			}
			inGroup[k] = true
			members = append(members, k)
		}
	}
	var alive, dropped []string
	r.mu.Lock()
	for _, m := range r.members {
		m.mu.Lock()
		if m.proc != nil && m.proc.Running() {
			k := fmt.Sprintf("m%d-%d", m.idx, m.incarnation)
			alive = append(alive, k)
			if m.static {
				k = fmt.Sprintf("m%d", m.idx)
			}
			last, seen := r.lastGroupReq[k]
			if !inGroup[k] && seen && last.key == kmsg.JoinGroup && time.Since(last.at) > r.s.SessionTimeout {
				dropped = append(dropped, fmt.Sprintf("%s (waiting in JoinGroup since %s)", k, last.at.Sub(r.start).Round(time.Millisecond)))
			}
		}
		m.mu.Unlock()
	}
	r.mu.Unlock()
	state := "unknown"
	if info != nil {
		state = fmt.Sprintf("%s, generation %d", info.State, info.Epoch)
	}
	r.mu.Lock()
	preparing := time.Time{}
	if info != nil && info.State == "PreparingRebalance" && r.preparingGen == info.Epoch {
		preparing = r.preparing
	}
	r.mu.Unlock()
	verdict := "engine failure"
	switch {
	case len(dropped) > 0:
		verdict = fmt.Sprintf("broker deviation: the test broker dropped %v while they waited in JoinGroup and never answered them; Apache Kafka keeps members that wait in a join alive (docs/testing.md, TestBrokerDropsMembersWaitingInJoin)", dropped)
	case !preparing.IsZero() && time.Since(preparing) > rebalanceTimeout+5*time.Second:
		verdict = fmt.Sprintf("broker deviation: the group has been in its join phase for %s, since %s, past the %s rebalance timeout by which Apache Kafka ends it whatever the members do (docs/testing.md)",
			time.Since(preparing).Round(time.Second), preparing.Sub(r.start).Round(time.Millisecond), rebalanceTimeout)
	}
	r.violate("liveness: %d good records not applied %s after the last fault; group %s; broker's members %v; live processes %v; %s",
		missing, bound, state, members, alive, verdict)
}

// checkIdle checks, once everything is applied, that every live member
// gives its memory budget back.
func (r *run) checkIdle() {
	for _, m := range r.members {
		m.mu.Lock()
		p := m.proc
		m.mu.Unlock()
		if p == nil || !p.Running() {
			continue
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			v, found, err := p.Metric(context.Background(), "ratchet_held_bytes")
			if err == nil && found && v == 0 {
				break
			}
			if time.Now().After(deadline) {
				r.violate("%s holds %v budget bytes while idle (ratchet_held_bytes; err %v)", p.Name, v, err)
				break
			}
			time.Sleep(200 * time.Millisecond) // the gauge is sampled every second
		}
	}
}

// stopAll stops every live member at once, as a rollout's end does.
func (r *run) stopAll() {
	var wg sync.WaitGroup
	for _, m := range r.members {
		wg.Go(func() { r.stopMember(m, false) })
	}
	wg.Wait()
}

// check verifies the invariants of the finished run.
func (r *run) check() {
	want, dead := r.expected()
	got, err := r.rollups()
	if err != nil {
		r.violate("read rollups: %v", err)
		return
	}
	exact := r.s.Mode == chaos.ExactlyOnce
	var wantTotal, gotTotal int64
	var lost, doubled []string
	for k, w := range want {
		g := got[k]
		wantTotal += w.count
		switch {
		case g.count < w.count:
			lost = append(lost, fmt.Sprintf("%s@%s %d<%d", k.metric, k.bucket.Format("15:04"), g.count, w.count))
		case exact && (g.count != w.count || math.Abs(g.sum-w.sum) > 1e-6*max(1, math.Abs(w.sum))):
			doubled = append(doubled, fmt.Sprintf("%s@%s count %d sum %.3f, want %d %.3f", k.metric, k.bucket.Format("15:04"), g.count, g.sum, w.count, w.sum))
		}
	}
	for k, g := range got {
		gotTotal += g.count
		if _, ok := want[k]; !ok {
			doubled = append(doubled, fmt.Sprintf("%s@%s: a bucket no record makes (count %d)", k.metric, k.bucket.Format("15:04"), g.count))
		}
	}
	if len(lost) > 0 {
		r.violate("lost: %d buckets short (%d counted, %d due): %v", len(lost), gotTotal, wantTotal, first(lost, 5))
	}
	if exact && len(doubled) > 0 {
		r.violate("exactly-once: %d buckets off (%d counted, %d due): %v", len(doubled), gotTotal, wantTotal, first(doubled, 5))
	}
	if !exact {
		announced := r.announcedReplays()
		r.mu.Lock()
		allowance := r.silentBound
		r.mu.Unlock()
		if replayed := gotTotal - wantTotal; replayed > announced+allowance {
			r.violate("at-least-once: %d records replayed, %d announced by the members that gave up their commits (+%d allowed for %d kills and long pauses: what the group had not committed at each)",
				replayed, announced, allowance, r.silentLosses)
		} else {
			r.note("at-least-once: %d replayed, %d announced, %d allowed for %d silent losses", gotTotal-wantTotal, announced, allowance, r.silentLosses)
		}
	}
	r.checkDLQ(dead)
	if r.s.Pipelines {
		r.checkPipelines()
	}
	if exact {
		r.checkDeadLetterRows(dead)
		r.checkCommitted()
	}
}

func first(s []string, n int) []string {
	slices.Sort(s)
	return s[:min(n, len(s))]
}

// announcedReplays adds up what the members' logs announced they leave to
// replay (the "replay" count of their error lines).
func (r *run) announcedReplays() int64 {
	var n int64
	ents, _ := os.ReadDir(r.dir)
	for _, e := range ents {
		b, err := os.ReadFile(r.dir + "/" + e.Name())
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			if !strings.Contains(line, `"replay"`) {
				continue
			}
			var l struct {
				Replay int64 `json:"replay"`
			}
			if json.Unmarshal([]byte(line), &l) == nil {
				n += l.Replay
			}
		}
	}
	return n
}

// announcedUncommitted reads what the members' logs announced they left
// uncommitted in Kafka in exactly-once mode (the store still guarding it):
// partition, stored offset and Kafka's committed offset of each line.
func (r *run) announcedUncommitted() map[[3]int64]bool {
	out := map[[3]int64]bool{}
	ents, _ := os.ReadDir(r.dir)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(r.dir, e.Name()))
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			if !strings.Contains(line, `"msg":"applied offsets left uncommitted in Kafka; the offset store still guards them"`) {
				continue
			}
			var l struct {
				Partition int64 `json:"partition"`
				Offset    int64 `json:"offset"`
				Committed int64 `json:"kafka_committed"`
			}
			if json.Unmarshal([]byte(line), &l) == nil {
				out[[3]int64{l.Partition, l.Offset, l.Committed}] = true
			}
		}
	}
	return out
}

// checkDLQ reads the dead-letter topic: exactly the poison records, each
// at least once per time it was due. Repeats are noted, not failed: the
// dead-letter topic is at-least-once in both modes.
func (r *run) checkDLQ(dead map[[2]int64]int) {
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": r.addr, "group.id": "chaos-dlq-reader",
		"enable.auto.commit": false, "log_level": 3})
	if err != nil {
		r.violate("dlq reader: %v", err)
		return
	}
	defer c.Close()
	var tps []kafka.TopicPartition
	want := int64(0)
	t := dlqTopic
	for _, p := range r.cluster.PartitionInfos(dlqTopic) {
		tps = append(tps, kafka.TopicPartition{Topic: &t, Partition: p.Partition, Offset: kafka.OffsetBeginning})
		want += p.HighWatermark - p.LogStartOffset
	}
	if err := c.Assign(tps); err != nil {
		r.violate("dlq reader: %v", err)
		return
	}
	got := map[[2]int64]int{}
	deadline := time.Now().Add(30 * time.Second)
	for n := int64(0); n < want && time.Now().Before(deadline); {
		m, err := c.ReadMessage(time.Second)
		if err != nil {
			continue
		}
		n++
		var src [2]int64
		for _, h := range m.Headers {
			switch h.Key {
			case "ratchet.partition":
				src[0], _ = strconv.ParseInt(string(h.Value), 10, 64)
			case "ratchet.offset":
				src[1], _ = strconv.ParseInt(string(h.Value), 10, 64)
			}
		}
		got[src]++
	}
	var missing, extra, repeated []string
	for k, n := range dead {
		if got[k] < n {
			missing = append(missing, fmt.Sprintf("%d@%d", k[0], k[1]))
		}
	}
	for k, n := range got {
		switch {
		case dead[k] == 0:
			extra = append(extra, fmt.Sprintf("%d@%d×%d", k[0], k[1], n))
		case n > dead[k]:
			repeated = append(repeated, fmt.Sprintf("%d@%d×%d", k[0], k[1], n))
		}
	}
	if len(missing) > 0 {
		r.violate("dead letters missing for %d poison records: %v", len(missing), first(missing, 10))
	}
	if len(extra) > 0 {
		r.violate("dead-letter topic holds %d records that are not poison: %v", len(extra), first(extra, 10))
	}
	if len(repeated) > 0 {
		// The dead-letter topic is at-least-once (docs/guarantees.md): a
		// batch whose transaction is refused or lost after its dead
		// letters were delivered writes them again when it is applied
		// again. ratchet_dead_letters still records each once.
		r.note("%d poison records dead-lettered more often than due (the DLQ is at-least-once): %v", len(repeated), first(repeated, 10))
	}
}

// checkDeadLetterRows checks ratchet_dead_letters, which the batch
// transactions write in exactly-once mode: one row per poison record,
// nothing else.
func (r *run) checkDeadLetterRows(dead map[[2]int64]int) {
	rows, err := r.pool.Query(context.Background(), `SELECT partition, "offset" FROM ratchet_dead_letters WHERE consumer_group = $1 AND topic = $2`, group, topic)
	if err != nil {
		r.violate("read ratchet_dead_letters: %v", err)
		return
	}
	defer rows.Close()
	seen := map[[2]int64]bool{}
	var extra []string
	for rows.Next() {
		var k [2]int64
		if err := rows.Scan(&k[0], &k[1]); err != nil {
			r.violate("read ratchet_dead_letters: %v", err)
			return
		}
		seen[k] = true
		if dead[k] == 0 {
			extra = append(extra, fmt.Sprintf("%d@%d", k[0], k[1]))
		}
	}
	var missing []string
	for k := range dead {
		if !seen[k] {
			missing = append(missing, fmt.Sprintf("%d@%d", k[0], k[1]))
		}
	}
	if len(missing) > 0 || len(extra) > 0 {
		r.violate("ratchet_dead_letters: %d poison records without a row %v, %d rows for records that are not poison %v",
			len(missing), first(missing, 10), len(extra), first(extra, 10))
	}
}

// checkCommitted compares, after the final stop, Kafka's committed offsets
// with the stored positions: exactly-once leaves them equal.
func (r *run) checkCommitted() {
	rows, err := r.pool.Query(context.Background(), `SELECT partition, next_offset FROM ratchet_offsets WHERE consumer_group = $1 AND topic = $2`, group, topic)
	if err != nil {
		r.violate("read stored offsets: %v", err)
		return
	}
	stored := map[int32]int64{}
	for rows.Next() {
		var p int32
		var n int64
		if err := rows.Scan(&p, &n); err == nil {
			stored[p] = n
		}
	}
	rows.Close()
	info := r.cluster.GroupInfo(group)
	announced := r.announcedUncommitted()
	var off []string
	for p, n := range stored {
		var c int64 = -1
		if info != nil {
			if cm, ok := info.Commits[topic][p]; ok {
				c = cm.Offset
			}
		}
		switch {
		case c == n:
		case announced[[3]int64{int64(p), n, c}]:
			// A member that could not commit it before its stop's
			// deadline (the group was rebalancing, waiting for members
			// that had left without a word) said so, naming both offsets;
			// the store guards the position and the next owner commits it.
			r.note("partition %d: Kafka's committed offset %d, stored %d, as the member that stopped announced", p, c, n)
		default:
			off = append(off, fmt.Sprintf("partition %d: committed %d, stored %d", p, c, n))
		}
	}
	if len(off) > 0 {
		r.violate("after the final stop Kafka's committed offsets differ from the stored ones: %v", first(off, 10))
	}
}

// report prints a failed run: seed, schedule, what happened, the
// invariants broken, where the logs are, and how to replay it.
func (r *run) report(t *testing.T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	verdict := "clean"
	if len(r.violations) > 0 {
		verdict = "FAILED"
	}
	fmt.Fprintf(&b, "chaos seed %d %s: %d records delivered\n\n%s\nwhat happened:\n", r.s.Seed, verdict, len(r.delivered), r.s)
	for _, l := range r.journal {
		fmt.Fprintf(&b, "  %s\n", l)
	}
	if len(r.violations) == 0 {
		t.Log(b.String())
		return
	}
	b.WriteString("\ninvariants broken:\n")
	for _, v := range r.violations {
		fmt.Fprintf(&b, "  - %s\n", v)
	}
	fmt.Fprintf(&b, "\nlogs: %s\nreplay: CHAOS_SEED=%d CHAOS_DURATION=%s make chaos\n", r.dir, r.s.Seed, r.s.Load)
	t.Error(b.String())
}
