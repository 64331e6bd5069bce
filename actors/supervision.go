package actors

import (
	"fmt"
	"runtime/debug"

	"github.com/asynkron/protoactor-go/actor"
)

// spawnPartition asks the supervisor actor to spawn a partition actor as
// its child. Sent by the poll loop with RequestFuture; the reply is *actor.PID.
type spawnPartition struct{ cfg *PartitionConfig }

// supervisorActor is the parent of the partition actors: spawning them as
// its children puts their failures under its strategy (HandleFailure).
type supervisorActor struct {
	cfg        *SupervisorConfig
	children   map[string]child // by child id
	overBudget chan<- TopicPartition
}

type child struct {
	tp       TopicPartition
	progress *Progress
}

// Receive implements actor.Actor.
func (a *supervisorActor) Receive(c actor.Context) {
	switch msg := c.Message().(type) {
	case *spawnPartition:
		name := fmt.Sprintf("partition-%s-%d-%d", msg.cfg.TP.Topic, msg.cfg.TP.Partition, msg.cfg.Gen)
		props := actor.PropsFromProducer(NewPartition(msg.cfg))
		pid, err := c.SpawnNamed(props, name)
		if err != nil {
			c.Respond(err)
			return
		}
		a.children[pid.Id] = child{tp: msg.cfg.TP, progress: msg.cfg.Progress}
		c.Respond(pid)
	case *actor.Terminated:
		delete(a.children, msg.Who.Id)
	}
}

// HandleFailure implements actor.SupervisorStrategy for the partition
// actors: one-for-one, restart within the budget (MaxRestarts within
// RestartWindow), stop past it. Every decision is logged, with the stack
// of a recovered panic at debug level, and restarts are counted.
func (a *supervisorActor) HandleFailure(_ *actor.ActorSystem, sup actor.Supervisor, child *actor.PID,
	rs *actor.RestartStatistics, reason any, message any) {
	rs.Fail()
	n := rs.NumberOfFailures(a.cfg.RestartWindow)
	ch := a.children[child.Id]
	log := a.cfg.Logger.With("actor", "partition", "topic", ch.tp.Topic, "partition", ch.tp.Partition,
		"reason", fmt.Sprint(reason), "restarts", n)
	var stack []byte
	switch r := reason.(type) {
	case *PanicError:
		log, stack = log.With("offset", r.Offset, "first_offset", r.Offset), r.Stack
	default:
		stack = debug.Stack()
		if rs, ok := message.(*Records); ok && len(rs.Msgs) > 0 {
			log = log.With("offset", int64(rs.Msgs[0].TopicPartition.Offset))
		}
	}
	a.cfg.Logger.Debug("partition actor failure stack", "topic", ch.tp.Topic, "partition", ch.tp.Partition,
		"stack", string(stack))
	if n > a.cfg.MaxRestarts {
		// Policy: a partition that keeps failing on different records is
		// not healthy, and skipping it would lose records. Stop it and stop
		// the process non-zero (after draining the others) so that the
		// container restarts and the group re-balances.
		log.Error("partition actor over its restart budget; stopping the engine",
			"budget", a.cfg.MaxRestarts, "window", a.cfg.RestartWindow.String())
		sup.StopChildren(child)
		select {
		case a.overBudget <- ch.tp:
		default:
		}
		return
	}
	a.cfg.Metrics.Restarts.WithLabelValues("partition").Inc()
	if ch.progress != nil {
		ch.progress.Restarts.Add(1)
	}
	log.Warn("partition actor restarted")
	sup.RestartChildren(child)
}

// The assertion keeps a signature drift from silently falling back to
// protoactor's default strategy (10 restarts in 10 s, then stop).
var _ actor.SupervisorStrategy = (*supervisorActor)(nil)
