// Command ratchet is an actor-based Kafka → PostgreSQL stream processor
// whose consumer group position only moves forward.
//
// Usage: ratchet run|dev|broker|produce|offsets|migrate|version [flags]
// Exit codes: 0 clean stop, 2 bad configuration or usage, 1 anything else.
package main

import (
	"os"

	"ratchet/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}
