// Package gcpolicy sets the Go collector of a ratchet process: a soft
// memory limit that follows processing.memory_budget, and, under a limit,
// a heap that grows further between collections than Go's default.
//
// The collector's work follows the bytes a process allocates: at Go's
// default (GOGC=100) it marks about one byte of live heap for every byte
// allocated, and a pipeline allocates for every record it reads (the Kafka
// client's message and value, the decoded fields, the statement's
// arguments). With a soft limit in effect, a larger growth ratio costs no
// memory past the limit: the collector starts at the smaller of the two
// goals, so it never runs more often than at GOGC=100, only less while the
// heap is below the limit. deploy/README.md (Sizing) gives the figures.
package gcpolicy

import (
	"math"
	"runtime/debug"
	"strings"
)

// Percent is the collector's growth ratio (GOGC) a ratchet process sets
// when GOGC is not in its environment and a soft memory limit is in
// effect: the heap may grow to five times what is live, up to the limit.
// In the drains of make bench (section l) it took a quarter off the
// engine's CPU per record, which the collector's mark work had been.
const Percent = 400

// Limit is the soft memory limit for a memory budget when GOMEMLIMIT is not
// set: twice processing.memory_budget (the records the partition actors
// hold, and room above them) plus 32 MiB for the rest of the heap
// (partition actors, decoders, metrics, the pool): 96 MiB at the default
// budget. With Percent the heap reaches the limit whenever a fifth of it
// is live, so the process's RSS under load is about this plus what lies
// outside the Go heap, 65-85 MiB with 1,024 partitions (the binary's code,
// librdkafka's buffers and partition state): 173 MiB draining with 1,024
// partitions, where 2 × budget + 64 MiB gave 193-196 MiB and 2 × budget +
// 48 MiB 180-192 MiB, against a 200 MiB target.
func Limit(budget int64) int64 { return 2*budget + 32<<20 }

// Settings is what Apply set; a zero field was left as the environment
// (or the runtime's default) had it.
type Settings struct {
	Limit   int64 // the soft memory limit set, in bytes
	Percent int   // the GOGC set
}

// Apply sets the soft memory limit to Limit(budget) unless GOMEMLIMIT is
// in environ (the runtime read it already), then the collector's growth
// ratio to Percent unless GOGC is in environ or no finite limit is in
// effect (GOMEMLIMIT=off, say), where the heap would have nothing to stop
// its growth.
func Apply(environ []string, budget int64) Settings {
	var s Settings
	if !set(environ, "GOMEMLIMIT") {
		s.Limit = Limit(budget)
		debug.SetMemoryLimit(s.Limit)
	}
	if !set(environ, "GOGC") && debug.SetMemoryLimit(-1) != math.MaxInt64 {
		debug.SetGCPercent(Percent)
		s.Percent = Percent
	}
	return s
}

// GOGC is the process's current growth ratio (-1: off).
func GOGC() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

// set reports whether environ has name=, with any value: the runtime reads
// the variable at start, and an empty or invalid value is its to judge.
func set(environ []string, name string) bool {
	for _, kv := range environ {
		if strings.HasPrefix(kv, name+"=") {
			return true
		}
	}
	return false
}
