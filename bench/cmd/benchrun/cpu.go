package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// cpuStat is the machine's CPU time so far, from the first line of
// /proc/stat, in clock ticks: all of it, the part spent idle (waiting for
// I/O included), and the part stolen (given by the hypervisor to other
// guests while this one had work).
type cpuStat struct {
	total, idle, steal float64
	cpus               int // the cpuN lines
}

func readCPUStat() cpuStat {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuStat{}
	}
	line, rest, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return cpuStat{}
	}
	var st cpuStat
	for l := range strings.Lines(rest) {
		if len(l) > 3 && strings.HasPrefix(l, "cpu") && l[3] >= '0' && l[3] <= '9' {
			st.cpus++
		}
	}
	for i, v := range f[1:] {
		if i >= 8 { // guest time is counted in user time already
			break
		}
		x, _ := strconv.ParseFloat(v, 64)
		st.total += x
		switch i {
		case 3, 4: // idle, iowait
			st.idle += x
		case 7:
			st.steal = x
		}
	}
	return st
}

// stealPercent is the share of CPU time stolen between a and b; -1 when
// /proc/stat could not be read.
func stealPercent(a, b cpuStat) float64 {
	if b.total <= a.total {
		return -1
	}
	return 100 * (b.steal - a.steal) / (b.total - a.total)
}

// procTicks is the CPU time (user and system, every thread: librdkafka's
// included) a process has used so far, in clock ticks; 0 when unknown.
func procTicks(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces; the fields after it
	// start behind its closing parenthesis, at field 3 (state).
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(f[11], 64) // field 14
	stime, _ := strconv.ParseFloat(f[12], 64) // field 15
	return utime + stime
}

// cpuSample is where the machine's CPU time and that of this process and
// of the broker process stood at one moment.
type cpuSample struct {
	machine      cpuStat
	self, broker float64
}

func sampleCPU(brokerPID int) cpuSample {
	s := cpuSample{machine: readCPUStat(), self: procTicks(os.Getpid())}
	if brokerPID > 0 {
		s.broker = procTicks(brokerPID)
	}
	return s
}

// cpuUse is how many cores were busy on average between two samples: on
// the whole machine (steal not counted), in this process (the engine or
// the Poll loop under test, with librdkafka's threads), in the broker, and
// the rest (PostgreSQL's server processes above all).
type cpuUse struct{ machine, self, broker float64 }

func (u cpuUse) rest() float64 { return max(u.machine-u.self-u.broker, 0) }

// since is the use from a to b. Clock ticks are turned into cores through
// the machine's own total, which grows by one tick per CPU per tick.
func (b cpuSample) since(a cpuSample) cpuUse {
	total := b.machine.total - a.machine.total
	if total <= 0 {
		return cpuUse{}
	}
	cores := float64(b.machine.cpus) / total
	busy := total - (b.machine.idle - a.machine.idle) - (b.machine.steal - a.machine.steal)
	return cpuUse{machine: busy * cores, self: (b.self - a.self) * cores, broker: (b.broker - a.broker) * cores}
}
