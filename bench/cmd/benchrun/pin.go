package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// The pinned variant of section (l) gives PostgreSQL the same CPU in the
// pipeline's runs as in the baseline's. Unpinned, on a machine whose few
// cores PostgreSQL, the broker and the client share, the direct pgx loop
// leaves PostgreSQL nearly every core while the pipeline's engine takes
// part of them for reading Kafka and evaluating: the ratio then measures
// how the client's CPU competes with the database's, not how near the
// pipeline comes to what the database takes. Pinned, PostgreSQL (every
// process of the local server, and the backends it forks later) runs on
// CPU pgCPU only and the bench process (the engine, librdkafka's threads,
// the direct loop, the Poll loop) and the broker on the others, as they
// would on separate machines or containers.

// pinError is a pinning that could not be done: the pinned rows are
// skipped, the rest of the run goes on.
type pinError struct{ err error }

func (e *pinError) Error() string { return "cannot pin: " + e.err.Error() }

func (e *pinError) Unwrap() error { return e.err }

// pinning is what pinCPUs set, to undo.
type pinning struct {
	pids []int // processes whose every thread was pinned
}

// pinSection pins for a section's pinned pass (pinCPUs: PostgreSQL to CPU
// 0, this process and the broker to the others) and says so; the caller
// undoes it. A failure is a *pinError.
func pinSection(env *benchEnv, section string, say func(string, ...any)) (*pinning, error) {
	p, err := pinCPUs(env.brokerPID, 0)
	if err != nil {
		return nil, &pinError{err}
	}
	say("%s pinned: PostgreSQL on CPU 0, this process and the broker on the others", section)
	return p, nil
}

// pinCPUs pins the local PostgreSQL server to CPU pgCPU and this process
// and the broker (brokerPID, 0: none) to every other CPU. It needs
// permission to set another user's affinity (root) and two CPUs or more.
func pinCPUs(brokerPID, pgCPU int) (*pinning, error) {
	n := runtime.NumCPU()
	if n < 2 {
		return nil, fmt.Errorf("pinning needs two CPUs or more, this machine has %d", n)
	}
	var pg, rest unix.CPUSet
	pg.Set(pgCPU)
	for c := range n {
		if c != pgCPU {
			rest.Set(c)
		}
	}
	pgPIDs, err := postgresPIDs()
	if err != nil {
		return nil, err
	}
	if len(pgPIDs) == 0 {
		return nil, fmt.Errorf("no local PostgreSQL process found in /proc")
	}
	p := &pinning{}
	for _, pid := range pgPIDs {
		if err := setAffinity(pid, &pg); err != nil {
			p.undo()
			return nil, err
		}
		p.pids = append(p.pids, pid)
	}
	for _, pid := range []int{os.Getpid(), brokerPID} {
		if pid == 0 {
			continue
		}
		if err := setAffinity(pid, &rest); err != nil {
			p.undo()
			return nil, err
		}
		p.pids = append(p.pids, pid)
	}
	return p, nil
}

// undo gives every thread of the pinned processes, and of PostgreSQL
// processes forked since, every CPU back.
func (p *pinning) undo() {
	if p == nil {
		return
	}
	var all unix.CPUSet
	for c := range runtime.NumCPU() {
		all.Set(c)
	}
	pids := p.pids
	if more, err := postgresPIDs(); err == nil {
		pids = append(pids, more...)
	}
	for _, pid := range pids {
		_ = setAffinity(pid, &all)
	}
}

// setAffinity sets the CPU set of every thread of pid.
func setAffinity(pid int, set *unix.CPUSet) error {
	tids, err := readDirNames(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	if err != nil {
		return fmt.Errorf("threads of pid %d: %w", pid, err)
	}
	for _, t := range tids {
		tid, err := strconv.Atoi(t)
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, set); err != nil && err != unix.ESRCH {
			return fmt.Errorf("set the CPU affinity of pid %d thread %d: %w", pid, tid, err)
		}
	}
	return nil
}

// postgresPIDs are the processes named postgres.
func postgresPIDs() ([]int, error) {
	names, err := readDirNames("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		if comm, _, ok := procStat(pid); ok && comm == "postgres" {
			out = append(out, pid)
		}
	}
	return out, nil
}
