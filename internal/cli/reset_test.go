package cli

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/twmb/franz-go/pkg/kfake"

	"ratchet/config"
	"ratchet/internal/store"
	"ratchet/internal/testenv"
)

// committedOffset is the group's committed offset of partition p on the
// broker (-1: none).
func committedOffset(c *kfake.Cluster, group string, p int32) int64 {
	info := c.GroupInfo(group)
	if info == nil {
		return -1
	}
	got, ok := info.Commits[opsTopic][p]
	if !ok {
		return -1
	}
	return got.Offset
}

// ends returns the end offset of every partition of topic.
func ends(c *kfake.Cluster, topic string) map[int32]int64 {
	out := map[int32]int64{}
	for _, p := range c.PartitionInfos(topic) {
		out[p.Partition] = p.HighWatermark
	}
	return out
}

// waitCaughtUp waits until every stored position is at its partition's end
// and Kafka's committed offsets are there too.
func waitCaughtUp(tb testing.TB, c *kfake.Cluster, o *opsEnv, group string) {
	tb.Helper()
	end := ends(c, opsTopic)
	testenv.Eventually(tb, 90*time.Second, func() bool {
		for p, e := range end {
			if o.count(tb, `SELECT coalesce(max(next_offset), -1) FROM ratchet_offsets WHERE topic = $1 AND partition = $2`, opsTopic, p) != e {
				return false
			}
			if e > 0 && committedOffset(c, group, p) != e {
				return false
			}
		}
		return true
	}, "stored and committed offsets reach the ends %v", end)
}

// assertApplied checks the ledger: every offset of every partition below
// twice[p] applied exactly twice, every other produced offset exactly once,
// nothing else.
func assertApplied(tb testing.TB, o *opsEnv, produced []sent, twice map[int32]int64) {
	tb.Helper()
	type po struct {
		p int32
		o int64
	}
	want := map[po]int64{}
	for _, s := range produced {
		n := int64(1)
		if s.offset < twice[s.partition] {
			n = 2
		}
		want[po{s.partition, s.offset}] = n
	}
	rows, err := o.pool.Query(context.Background(), `SELECT partition, off, count(*) FROM test_ledger GROUP BY 1, 2`)
	if err != nil {
		tb.Fatal(err)
	}
	got := map[po]int64{}
	for rows.Next() {
		var k po
		var n int64
		if err := rows.Scan(&k.p, &k.o, &n); err != nil {
			tb.Fatal(err)
		}
		got[k] = n
	}
	if rows.Err() != nil {
		tb.Fatal(rows.Err())
	}
	bad := 0
	for k, n := range want {
		if got[k] != n {
			if bad++; bad <= 10 {
				tb.Errorf("%d@%d applied %d times, want %d", k.p, k.o, got[k], n)
			}
		}
	}
	for k, n := range got {
		if _, ok := want[k]; !ok {
			if bad++; bad <= 10 {
				tb.Errorf("%d@%d applied %d times, never produced", k.p, k.o, n)
			}
		}
	}
	if bad > 10 {
		tb.Errorf("%d offsets wrong in all", bad)
	}
}

// TestResetToEarliestWhileRunningUnderLoad: an exactly-once instance keeps
// running under load while every partition is reset to its start. It
// resumes from there at its next batch without a new claim, and in the end
// every record before the position each partition had at the move is
// applied exactly twice, every other record exactly once.
func TestResetToEarliestWhileRunningUnderLoad(t *testing.T) {
	cluster, addr := testenv.Kafka(t, 4, opsTopic, opsTopic+".dlq")
	o := newOpsEnv(t, addr, config.ModeExactlyOnce)
	cfg := o.config(t)
	eng := startEngine(t, cfg, newLedger("a"), "a")
	kp := newKafkaProducer(t, addr)

	var mu sync.Mutex
	var produced []sent
	stop, streamed := make(chan struct{}), make(chan error, 1)
	go func() { // ends when stop is closed
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				streamed <- nil
				return
			case <-tick.C:
			}
			s, err := kp.send(kafka.PartitionAny, 20, positive, nil, time.Time{})
			if err != nil {
				streamed <- err
				return
			}
			mu.Lock()
			produced = append(produced, s...)
			mu.Unlock()
		}
	}()
	ledgerRows := func() int64 { return o.count(t, `SELECT count(*) FROM test_ledger`) }
	testenv.Eventually(t, 90*time.Second, func() bool { return ledgerRows() >= 2000 }, "2000 records applied")

	out := o.mustRun(t, "offsets", "reset", "--to-earliest", "--execute")
	moved := movedRows(t, out)
	if len(moved) != 4 {
		t.Fatalf("moved %d partitions, want 4:\n%s", len(moved), out)
	}
	if !strings.Contains(out, "active members") {
		t.Errorf("output does not say the running owners resume:\n%s", out)
	}
	atReset := ledgerRows()
	testenv.Eventually(t, 90*time.Second, func() bool { return ledgerRows() >= atReset+3000 }, "the engine goes on after the reset")
	close(stop)
	if err := <-streamed; err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, cluster, o, cfg.Kafka.GroupID)

	twice := map[int32]int64{}
	var replayed int64
	for p, m := range moved {
		if m[1] != 0 {
			t.Errorf("partition %d moved to %d, want 0", p, m[1])
		}
		twice[p] = m[0]
		replayed += m[0]
	}
	if replayed < 2000 {
		t.Errorf("the reset replays %d records, fewer than were applied before it", replayed)
	}
	assertApplied(t, o, produced, twice)
	if n := o.count(t, `SELECT count(*) FROM ratchet_offsets WHERE epoch <> 1`); n != 0 {
		t.Errorf("%d partitions were claimed again: the reset must not need a restart", n)
	}
	select {
	case <-eng.Exited():
		t.Fatalf("the engine exited: %v", eng.Wait(t, 0))
	default:
	}
}

// TestResetBackwardsCommitsFollowAndLatestSkipsTheGap holds a running
// exactly-once partition's batch before it writes anything and resets
// under it: to earliest, Kafka's committed offset goes back to 0 before
// the replay has applied anything (the owner commits the move); to latest,
// exactly the records between the old position and the end are skipped.
func TestResetBackwardsCommitsFollowAndLatestSkipsTheGap(t *testing.T) {
	cluster, addr := testenv.Kafka(t, 1, opsTopic, opsTopic+".dlq")
	o := newOpsEnv(t, addr, config.ModeExactlyOnce)
	cfg := o.config(t)
	l := newLedger("a")
	startEngine(t, cfg, l, "a")
	kp := newKafkaProducer(t, addr)
	group := cfg.Kafka.GroupID

	a, err := kp.send(0, 100, positive, nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, cluster, o, group)

	// Back to earliest while the batch of b waits.
	l.shut()
	b, err := kp.send(0, 20, positive, nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return l.waiting.Load() == 1 }, "a batch waits at the gate")
	moved := movedRows(t, o.mustRun(t, "offsets", "reset", "--to-earliest", "--execute"))
	if moved[0] != [2]int64{100, 0} {
		t.Fatalf("moved %v, want 0: 100 -> 0", moved)
	}
	l.gate <- struct{}{} // the waiting batch (100..119) runs and is refused
	testenv.Eventually(t, 30*time.Second, func() bool { return committedOffset(cluster, group, 0) == 0 },
		"Kafka's committed offset follows the reset to 0 (now %d)", committedOffset(cluster, group, 0))
	if n := o.count(t, `SELECT count(*) FROM test_ledger`); n != 100 {
		t.Fatalf("%d ledger rows while the replay waits, want 100", n)
	}
	l.open()
	waitCaughtUp(t, cluster, o, group)
	assertApplied(t, o, append(a, b...), map[int32]int64{0: 100})

	// Forward to latest while the batch of c waits: c is skipped.
	if _, err := o.pool.Exec(context.Background(), `TRUNCATE test_ledger`); err != nil {
		t.Fatal(err)
	}
	l.shut()
	c, err := kp.send(0, 50, positive, nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return l.waiting.Load() == 1 }, "a batch waits at the gate")
	moved = movedRows(t, o.mustRun(t, "offsets", "reset", "--to-latest", "--execute"))
	if moved[0] != [2]int64{120, 170} {
		t.Fatalf("moved %v, want 0: 120 -> 170", moved)
	}
	l.open()
	d, err := kp.send(0, 30, positive, nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, cluster, o, group)
	assertApplied(t, o, d, nil)
	if n := o.count(t, `SELECT count(*) FROM test_ledger WHERE off < 170`); n != 0 {
		t.Errorf("%d of the %d skipped records were applied", n, len(c))
	}
}

// TestResetRacingAClaimReportsTheRow: a partition claimed between the plan
// and its execution keeps the new claim's position and is reported; the
// others move, Kafka's committed offsets follow (no members), and the
// command fails so that scripts notice.
func TestResetRacingAClaimReportsTheRow(t *testing.T) {
	cluster, addr := testenv.Kafka(t, 3, opsTopic)
	o := newOpsEnv(t, addr, config.ModeExactlyOnce)
	cfg := o.config(t)
	kp := newKafkaProducer(t, addr)
	for p := int32(0); p < 3; p++ {
		if _, err := kp.send(p, 10, positive, nil, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	for p := int32(0); p < 3; p++ {
		if _, err := store.ClaimPartition(ctx, o.pool, cfg.Kafka.GroupID, opsTopic, p, "a", 10); err != nil {
			t.Fatal(err)
		}
	}
	opts, err := parseResetArgs(&env{stderr: &bytes.Buffer{}}, []string{"--to-offset", "4", "--execute"})
	if err != nil {
		t.Fatal(err)
	}
	k, err := openKafka(cfg, cfg.Kafka.GroupID)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	plan, err := planReset(ctx, cfg, k, o.pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	// Another instance claims partition 1 after the plan was made.
	if _, err := store.ClaimPartition(ctx, o.pool, cfg.Kafka.GroupID, opsTopic, 1, "b", 0); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	err = executeReset(ctx, &out, cfg, k, o.pool, opts, plan)
	if !errors.Is(err, errResetIncomplete) {
		t.Fatalf("execute: %v, want an incomplete reset\n%s", err, out.String())
	}
	if code := exitCode(&errOut, err); code != ExitError {
		t.Errorf("exit code %d, want %d", code, ExitError)
	}
	if !strings.Contains(out.String(), "NOT MOVED") || !strings.Contains(errOut.String(), "claimed") {
		t.Errorf("the changed row is not reported:\n%s\n%s", out.String(), errOut.String())
	}
	want := map[int32][2]int64{0: {1, 4}, 1: {2, 10}, 2: {1, 4}}
	stored, err := store.Offsets(ctx, o.pool, cfg.Kafka.GroupID)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stored {
		if w := want[s.Partition]; s.Epoch != w[0] || s.Next != w[1] {
			t.Errorf("partition %d: epoch %d at %d, want epoch %d at %d", s.Partition, s.Epoch, s.Next, w[0], w[1])
		}
	}
	for _, p := range []int32{0, 2} {
		if got := committedOffset(cluster, cfg.Kafka.GroupID, p); got != 4 {
			t.Errorf("partition %d: Kafka committed %d, want 4 (no members: the command commits)", p, got)
		}
	}
	if got := committedOffset(cluster, cfg.Kafka.GroupID, 1); got != -1 {
		t.Errorf("partition 1: Kafka committed %d, want nothing", got)
	}
}

// TestResetDryRunAndBadTargets: without --execute nothing changes; a topic
// or partition that does not exist is a usage error naming the flag; a
// target outside the log is clamped and said so.
func TestResetDryRunAndBadTargets(t *testing.T) {
	cluster, addr := testenv.Kafka(t, 2, opsTopic)
	o := newOpsEnv(t, addr, config.ModeExactlyOnce)
	cfg := o.config(t)
	kp := newKafkaProducer(t, addr)
	if _, err := kp.send(0, 10, positive, nil, time.Time{}); err != nil {
		t.Fatal(err)
	}
	t1 := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	t2 := t1.Add(time.Hour)
	for _, ts := range []time.Time{t1, t2} {
		if _, err := kp.send(1, 5, positive, nil, ts); err != nil {
			t.Fatal(err)
		}
	}
	// A group that never committed: ratchet offsets shows it all the same.
	if out := o.mustRun(t, "offsets"); !strings.Contains(out, "would-be rewind") {
		t.Errorf("ratchet offsets:\n%s", out)
	}
	o.extra = []string{"RATCHET_KAFKA_TOPICS=" + opsTopic + ",missing"}
	if _, err := store.ClaimPartition(context.Background(), o.pool, cfg.Kafka.GroupID, opsTopic, 0, "a", 10); err != nil {
		t.Fatal(err)
	}
	out := o.mustRun(t, "offsets", "reset", "--to-datetime", t2.Add(-time.Minute).Format(time.RFC3339), "--partitions", "1", "--topic", opsTopic)
	if rows := planRows(out); rows[1] != 5 || len(rows) != 1 {
		t.Errorf("--to-datetime between the two halves of partition 1: plan %v, want 1 -> 5\n%s", rows, out)
	}
	out = o.mustRun(t, "offsets", "reset", "--to-datetime", time.Now().Add(time.Hour).Format(time.RFC3339), "--topic", opsTopic)
	if rows := planRows(out); rows[0] != 10 || rows[1] != 10 || !strings.Contains(out, "no record at or after that time") {
		t.Errorf("--to-datetime after every record: plan %v, want the ends, said so\n%s", rows, out)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"not an input topic", []string{"--to-earliest", "--topic", "other"}, "--topic"},
		{"input topic missing in Kafka", []string{"--to-earliest", "--topic", "missing"}, "--topic"},
		{"no such partition", []string{"--to-earliest", "--topic", opsTopic, "--partitions", "0,2"}, "--partitions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := o.run(t, append([]string{"offsets", "reset"}, tc.args...)...)
			if code != ExitConfig || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d, want %d naming %s\nstdout: %s\nstderr: %s", code, ExitConfig, tc.want, out, errOut)
			}
		})
	}
	out = o.mustRun(t, "offsets", "reset", "--to-offset", "25", "--topic", opsTopic)
	t.Logf("plan:\n%s", out)
	for _, want := range []string{"dry run", "clamped to 10", "+0", "clamped to 10"} {
		if !strings.Contains(out, want) {
			t.Errorf("plan does not say %q:\n%s", want, out)
		}
	}
	out = o.mustRun(t, "offsets", "reset", "--shift-by", "-3", "--topic", opsTopic, "--partitions", "0")
	if !strings.Contains(out, "-3") || strings.Contains(out, "\nevents  1") {
		t.Errorf("plan for partition 0 shifted by -3:\n%s", out)
	}
	if n := o.count(t, `SELECT next_offset FROM ratchet_offsets WHERE partition = 0`); n != 10 {
		t.Errorf("a dry run moved the stored offset to %d", n)
	}
	if got := committedOffset(cluster, cfg.Kafka.GroupID, 0); got != -1 {
		t.Errorf("a dry run committed %d", got)
	}
}

// planRows parses a dry run's plan: partition → new position.
func planRows(out string) map[int32]int64 {
	rows := map[int32]int64{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || f[0] != opsTopic {
			continue
		}
		p, err1 := strconv.Atoi(f[1])
		to, err2 := strconv.ParseInt(f[3], 10, 64)
		if err1 == nil && err2 == nil {
			rows[int32(p)] = to
		}
	}
	return rows
}

// TestResetAtLeastOnceRefusesWhileMembersRun: in at-least-once mode the
// command refuses while the group has members, and commits the new offsets
// once they have stopped; the next run then replays exactly that.
func TestResetAtLeastOnceRefusesWhileMembersRun(t *testing.T) {
	cluster, addr := testenv.Kafka(t, 2, opsTopic, opsTopic+".dlq")
	o := newOpsEnv(t, addr, config.ModeAtLeastOnce)
	cfg := o.config(t)
	kp := newKafkaProducer(t, addr)
	produced, err := kp.send(kafka.PartitionAny, 200, positive, nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	eng := startEngine(t, cfg, newLedger("a"), "a")
	end := ends(cluster, opsTopic)
	testenv.Eventually(t, 90*time.Second, func() bool {
		for p, e := range end {
			if e > 0 && committedOffset(cluster, cfg.Kafka.GroupID, p) != e {
				return false
			}
		}
		return true
	}, "everything applied and committed")

	code, out, errOut := o.run(t, "offsets", "reset", "--to-earliest", "--execute")
	if code != ExitError || !strings.Contains(errOut, "active members") {
		t.Fatalf("reset with a running member: exit %d, want %d with a clear message\nstdout: %s\nstderr: %s", code, ExitError, out, errOut)
	}
	if out := o.mustRun(t, "offsets", "reset", "--to-earliest"); !strings.Contains(out, "refuses until they have stopped") {
		t.Errorf("dry run does not warn about the members:\n%s", out)
	}
	eng.Stop(t)
	testenv.Eventually(t, 60*time.Second, func() bool {
		info := cluster.GroupInfo(cfg.Kafka.GroupID)
		return info != nil && len(info.Members) == 0
	}, "the group is empty")
	out = o.mustRun(t, "offsets", "reset", "--to-earliest", "--execute")
	if !strings.Contains(out, "committed 2 offsets") {
		t.Errorf("output:\n%s", out)
	}
	for p := range end {
		if got := committedOffset(cluster, cfg.Kafka.GroupID, p); got != 0 {
			t.Errorf("partition %d: committed %d, want 0", p, got)
		}
	}
	startEngine(t, cfg, newLedger("b"), "b")
	testenv.Eventually(t, 90*time.Second, func() bool { return o.count(t, `SELECT count(*) FROM test_ledger`) >= 400 }, "the replay")
	assertApplied(t, o, produced, end)
}
