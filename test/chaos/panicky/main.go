// Command panicky is ratchet for the chaos explorer: the real command line
// (internal/cli), with the built-in dashboard processor wrapped so that it
// panics on chosen records. Otherwise it behaves exactly like ratchet; with
// neither variable set it is ratchet, pipelines included.
//
//	RATCHET_CHAOS_PANIC_EVERY=N    panic once per process on every record
//	                               whose event id hashes to 0 mod N; the
//	                               restart applies it again (applied once)
//	RATCHET_CHAOS_PANIC_ALWAYS=M   panic at every attempt at records whose
//	                               id hashes to 0 mod M (dead-lettered)
//
// internal/chaos.PanicChoice tells a test which event ids these are;
// testenv.BuildPanicky builds this command.
package main

import (
	"fmt"
	"os"

	"ratchet/internal/chaos"
	"ratchet/internal/cli"
	"ratchet/processor/dashboard"
)

func main() {
	choice, environ, err := chaos.ParsePanicChoice(os.Environ())
	if err != nil {
		fmt.Fprintf(os.Stderr, "ratchet: %v\n", err)
		os.Exit(cli.ExitConfig)
	}
	var opts cli.Options
	if choice != (chaos.PanicChoice{}) {
		// Only a build that panics brings a processor of its own: one that
		// does not is plain ratchet, so it can run configured pipelines
		// (which a processor of the program's own excludes).
		opts.Processor = chaos.Panicky(dashboard.New(), choice)
	}
	os.Exit(cli.MainWith(os.Args[1:], environ, os.Stdout, os.Stderr, opts))
}
