package main

import (
	"os"
	"strconv"
	"strings"
)

// cpuStat is the machine's CPU time so far, from the first line of
// /proc/stat, in clock ticks: all of it, and the part stolen (given by the
// hypervisor to other guests while this one had work).
type cpuStat struct{ total, steal float64 }

func readCPUStat() cpuStat {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuStat{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return cpuStat{}
	}
	var st cpuStat
	for i, v := range f[1:] {
		if i >= 8 { // guest time is counted in user time already
			break
		}
		x, _ := strconv.ParseFloat(v, 64)
		st.total += x
		if i == 7 {
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
