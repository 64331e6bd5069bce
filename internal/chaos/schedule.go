// Package chaos draws the fault schedules of the chaos explorer
// (test/chaos): overlapping faults at random moments, all derived from one
// seed, so that any run the explorer reports as failed can be replayed
// exactly with CHAOS_SEED=N.
//
// The package is pure: Plan turns (seed, duration) into a Schedule and does
// no I/O. The explorer carries the schedule out against real `ratchet run`
// processes, a test broker and PostgreSQL behind a fault proxy, and checks
// the invariants afterwards.
package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Kind names a fault.
type Kind string

// The faults the explorer injects. Member faults name a member (Target);
// the others act on the whole run.
const (
	// Kill sends SIGKILL to a member and starts it again after Duration
	// (a crash and a pod restart).
	Kill Kind = "kill"
	// Term sends SIGTERM to a member, expects it to exit 0 within
	// shutdown.timeout, and starts it again after Duration (a rolling
	// restart).
	Term Kind = "term"
	// Pause sends SIGSTOP to a member and SIGCONT after Duration; a
	// Duration past the session timeout costs the member its partitions.
	Pause Kind = "pause"
	// ScaleUp starts a new member that stays.
	ScaleUp Kind = "scale-up"
	// ScaleDown stops a member for good (SIGTERM, no restart).
	ScaleDown Kind = "scale-down"
	// PostgresCut refuses and resets every PostgreSQL connection for
	// Duration.
	PostgresCut Kind = "postgres-cut"
	// PostgresSlow delays every PostgreSQL round trip by Delay for
	// Duration.
	PostgresSlow Kind = "postgres-slow"
	// PostgresLock holds an exclusive lock on the rollup table for
	// Duration: every batch waits, and so does every drain of a revoke
	// or a stop.
	PostgresLock Kind = "postgres-lock"
	// PostgresTerminate terminates the members' PostgreSQL backends
	// (pg_terminate_backend) once.
	PostgresTerminate Kind = "postgres-terminate"
	// BrokerFail fails the broker requests of one Request kind for
	// Duration with a retriable error.
	BrokerFail Kind = "broker-fail"
	// BrokerSlow holds each broker request of one Request kind for Delay
	// before the broker answers it, for Duration.
	BrokerSlow Kind = "broker-slow"
	// RegistryOutage makes the Schema Registry answer 503 for Duration
	// (runs whose topic is in the registry's wire format only): a member
	// that starts meanwhile has no schema cached and must wait, not
	// dead-letter.
	RegistryOutage Kind = "registry-outage"
	// Reset moves one partition's stored position back by Shift records
	// with `offsets reset` while the group runs (exactly-once only).
	Reset Kind = "offsets-reset"
)

// Request kinds a BrokerFail or BrokerSlow fault hits.
const (
	RequestFetch     = "fetch"
	RequestCommit    = "commit"
	RequestJoin      = "join"
	RequestHeartbeat = "heartbeat"
	RequestProduce   = "produce" // the dead-letter producer's, and the load's
)

// Commit modes, as in commit.mode.
const (
	ExactlyOnce  = "exactly-once"
	AtLeastOnce  = "at-least-once"
	maxMembers   = 4
	startMembers = 3
)

// Fault is one entry of a schedule.
type Fault struct {
	At       time.Duration // from the start of the load
	Kind     Kind
	Target   int           // member index, for member faults
	Duration time.Duration // how long the fault lasts (0: instant)
	Delay    time.Duration // PostgresSlow: added per round trip; BrokerSlow: per request
	Request  string        // BrokerFail, BrokerSlow: which requests
	// Partition and Shift: Reset moves Partition back by Shift records.
	Partition int32
	Shift     int64
}

// End is when the fault is over: the member is back, the link restored.
func (f Fault) End() time.Duration { return f.At + f.Duration }

// String is the fault as the explorer prints it in a schedule.
func (f Fault) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%7s %-18s", f.At.Round(time.Millisecond), f.Kind)
	switch f.Kind {
	case Kill, Term, Pause:
		fmt.Fprintf(&b, " member m%d for %s", f.Target, f.Duration.Round(time.Millisecond))
	case ScaleDown:
		fmt.Fprintf(&b, " member m%d", f.Target)
	case ScaleUp:
		fmt.Fprintf(&b, " member m%d", f.Target)
	case PostgresCut, PostgresLock, RegistryOutage:
		fmt.Fprintf(&b, " for %s", f.Duration.Round(time.Millisecond))
	case PostgresSlow:
		fmt.Fprintf(&b, " +%s per round trip for %s", f.Delay, f.Duration.Round(time.Millisecond))
	case BrokerFail:
		fmt.Fprintf(&b, " %s requests for %s", f.Request, f.Duration.Round(time.Millisecond))
	case BrokerSlow:
		fmt.Fprintf(&b, " %s requests +%s each for %s", f.Request, f.Delay, f.Duration.Round(time.Millisecond))
	case Reset:
		fmt.Fprintf(&b, " partition %d back by %d", f.Partition, f.Shift)
	}
	return b.String()
}

// Member is one `ratchet run` instance of a schedule.
type Member struct {
	// Static members run with kafka.instance_id (StatefulSet pods); the
	// others are dynamic members.
	Static bool
}

// Schedule is everything a run does, drawn from Seed.
type Schedule struct {
	Seed       uint64
	Mode       string // commit.mode
	Partitions int32
	Rate       int // events per second
	Poison     float64
	// PanicEvery, when not 0, makes every member's processor panic once
	// per process on about one event in PanicEvery (the chaos build,
	// RATCHET_CHAOS_PANIC_EVERY): each panic is a supervised restart that
	// applies the batch again.
	PanicEvery int
	// Registry: the topic is in the Schema Registry's wire format (magic
	// byte, schema id) and the members decode it through a registry.
	Registry bool
	// Pipelines: the members run configured pipelines instead of the
	// built-in processor: the dashboard as a pipeline on the event topic,
	// and an upsert and a rollup on a second, JSON topic whose records
	// include bad ones (not JSON, a missing field, a wrong type, values
	// PostgreSQL refuses for their column). Drawn only where PanicEvery
	// is 0: the panicking build wraps the built-in processor, and a
	// processor of the program's own excludes pipelines.
	Pipelines bool
	Load      time.Duration // how long the producer runs
	// SessionTimeout is the members' session.timeout.ms.
	SessionTimeout time.Duration
	// ShutdownTimeout is the members' shutdown.timeout.
	ShutdownTimeout time.Duration
	// Members are the instances: the first startMembers start with the
	// run, ScaleUp faults add the rest.
	Members []Member
	Faults  []Fault
}

// LastFaultEnd is when the last fault of the schedule is over.
func (s Schedule) LastFaultEnd() time.Duration {
	var end time.Duration
	for _, f := range s.Faults {
		end = max(end, f.End())
	}
	return end
}

// StaticLeftForGood reports whether a static member leaves for good: its
// partitions then wait for the session timeout (a static member sends no
// LeaveGroup), which the liveness bound must allow.
func (s Schedule) StaticLeftForGood() bool {
	for _, f := range s.Faults {
		if f.Kind == ScaleDown && s.Members[f.Target].Static {
			return true
		}
	}
	return false
}

// String prints the schedule: the parameters, the members and every fault
// with its time, in the order they start.
func (s Schedule) String() string {
	var b strings.Builder
	format := "protobuf"
	if s.Registry {
		format = "protobuf in the Schema Registry's wire format"
	}
	fmt.Fprintf(&b, "seed %d: %s, %d partitions, %s, %d events/s for %s, %.0f%% poison, session timeout %s, shutdown timeout %s\n",
		s.Seed, s.Mode, s.Partitions, format, s.Rate, s.Load, s.Poison*100, s.SessionTimeout, s.ShutdownTimeout)
	if s.PanicEvery > 0 {
		fmt.Fprintf(&b, "  the processor panics once per process on one event in %d\n", s.PanicEvery)
	}
	if s.Pipelines {
		fmt.Fprintf(&b, "  pipelines: the dashboard as a pipeline, and an upsert and a rollup on the JSON topic with bad records\n")
	}
	for i, m := range s.Members {
		kind := "dynamic"
		if m.Static {
			kind = "static"
		}
		when := "from the start"
		if i >= startMembers {
			when = "added by scale-up"
		}
		fmt.Fprintf(&b, "  member m%d: %s, %s\n", i, kind, when)
	}
	for _, f := range s.Faults {
		fmt.Fprintf(&b, "  %s\n", f)
	}
	return b.String()
}

// Plan draws the schedule of seed for a load of the given length. Equal
// arguments give equal schedules. Faults overlap: each starts at a random
// moment of the load, independently of the others, and lasts from under a
// second to several seconds. The plan keeps what a real deployment keeps:
// at least one member is never stopped for good, a member is not hit by a
// second member fault while the first lasts, and an offsets reset happens
// only in exactly-once mode.
func Plan(seed uint64, load time.Duration) Schedule {
	rng := rand.New(rand.NewPCG(seed, 0x7261746368657421)) // "ratchet!"
	s := Schedule{
		Seed:            seed,
		Mode:            []string{ExactlyOnce, AtLeastOnce}[seed%2],
		Partitions:      int32(4 + rng.IntN(5)), // 4–8
		Rate:            300 + 50*rng.IntN(9),   // 300–700 events/s
		Poison:          0.01,
		Load:            load,
		SessionTimeout:  time.Duration(6+rng.IntN(5)) * time.Second, // 6–10 s
		ShutdownTimeout: 10 * time.Second,
	}
	s.Registry = rng.IntN(3) == 0
	// Mixed membership: the first member is static and the second dynamic
	// in every run; the rest are drawn.
	for i := range maxMembers {
		static := rng.IntN(2) == 0
		switch i {
		case 0:
			static = true
		case 1:
			static = false
		}
		s.Members = append(s.Members, Member{Static: static})
	}

	// About one fault every 4 s of load, none in the first 3 s (the group
	// forms) or the last 2 s.
	n := max(3, int(load/(4*time.Second)))
	window := load - 5*time.Second
	if window <= 0 {
		window = load
	}
	busy := map[int]time.Duration{} // member → when its last fault ends
	alive := startMembers           // members running at the end, so far
	scaledUp := false
	kinds := []Kind{Kill, Term, Pause, Pause, PostgresCut, PostgresSlow, PostgresLock, PostgresTerminate,
		BrokerFail, BrokerFail, ScaleUp, ScaleDown}
	global := []Kind{PostgresCut, PostgresSlow, PostgresLock, PostgresTerminate, BrokerFail}
	if s.Mode == ExactlyOnce {
		kinds = append(kinds, Reset)
	}
	if s.Registry {
		kinds = append(kinds, RegistryOutage, RegistryOutage)
	}
	// The moments first, then the faults in time order, so that what a
	// fault may do (is its member still running? has the scale-up
	// happened?) follows from the faults before it.
	moments := make([]time.Duration, n)
	for i := range moments {
		moments[i] = 3*time.Second + time.Duration(rng.Int64N(int64(window)))
	}
	slices.Sort(moments)
	for _, at := range moments {
		f := Fault{At: at}
		f.Kind = kinds[rng.IntN(len(kinds))]
		switch f.Kind {
		case Kill, Term, Pause, ScaleDown:
			f.Target = rng.IntN(startMembers)
			if scaledUp && rng.IntN(2) == 0 {
				f.Target = startMembers
			}
			if f.At < busy[f.Target] || (f.Kind == ScaleDown && alive <= 2) {
				f.Kind = global[rng.IntN(len(global))] // the member is taken: a fault of the whole run
				break
			}
			switch f.Kind {
			case Kill, Term:
				f.Duration = time.Duration(200+rng.IntN(3000)) * time.Millisecond
			case Pause:
				// Half shorter than the session timeout, half longer.
				if rng.IntN(2) == 0 {
					f.Duration = time.Duration(rng.Int64N(int64(s.SessionTimeout / 2)))
				} else {
					f.Duration = s.SessionTimeout + time.Duration(rng.Int64N(int64(4*time.Second)))
				}
			case ScaleDown:
				alive--
				f.Duration = 0
				busy[f.Target] = load + time.Hour // gone for good
			}
			if f.Kind != ScaleDown {
				busy[f.Target] = f.End() + s.ShutdownTimeout
			}
		case ScaleUp:
			if scaledUp {
				f.Kind = global[rng.IntN(len(global))]
				break
			}
			scaledUp = true
			alive++
			f.Target = startMembers
			busy[f.Target] = f.At + 5*time.Second // let it join before it is hit
		}
		switch f.Kind {
		case PostgresCut:
			f.Duration = time.Duration(500+rng.IntN(8000)) * time.Millisecond
		case PostgresLock:
			f.Duration = time.Duration(1000+rng.IntN(10000)) * time.Millisecond
		case RegistryOutage:
			f.Duration = time.Duration(2000+rng.IntN(10000)) * time.Millisecond
		case PostgresSlow:
			f.Duration = time.Duration(1000+rng.IntN(5000)) * time.Millisecond
			f.Delay = time.Duration(20+rng.IntN(200)) * time.Millisecond
		case BrokerFail:
			f.Request = []string{RequestFetch, RequestCommit, RequestJoin, RequestHeartbeat, RequestProduce}[rng.IntN(5)]
			f.Duration = time.Duration(500+rng.IntN(5000)) * time.Millisecond
		case Reset:
			f.Partition = int32(rng.IntN(int(s.Partitions)))
			f.Shift = int64(1 + rng.IntN(200))
		}
		s.Faults = append(s.Faults, f)
	}
	if !scaledUp {
		s.Members = s.Members[:startMembers]
	}
	// Drawn last, so that adding it kept the faults of every seed.
	if rng.IntN(3) == 0 {
		s.PanicEvery = 2000 + 1000*rng.IntN(4)
	}
	// Half the broker faults delay the requests instead of failing them,
	// drawn from a stream of their own so that adding it kept every other
	// draw of every seed.
	slow := rand.New(rand.NewPCG(seed, 0x736c6f7762726f6b)) // "slowbrok"
	for i, f := range s.Faults {
		if f.Kind == BrokerFail && slow.IntN(2) == 0 {
			s.Faults[i].Kind = BrokerSlow
			s.Faults[i].Delay = time.Duration(100+slow.IntN(1900)) * time.Millisecond
		}
	}
	// Pipelines in about half the runs without planned panics, from a
	// stream of their own for the same reason.
	pipes := rand.New(rand.NewPCG(seed, 0x7069706573212121)) // "pipes!!!"
	s.Pipelines = s.PanicEvery == 0 && pipes.IntN(2) == 0
	return s
}
