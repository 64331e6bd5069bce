// Package cli implements ratchet's commands. Main parses the command line,
// loads the configuration, builds the logger, runs the command under a
// signal context, and maps the outcome to an exit code.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"ratchet/config"
	"ratchet/internal/store"
	"ratchet/processor"
)

// Exit codes.
const (
	ExitOK     = 0
	ExitError  = 1
	ExitConfig = 2
)

// usageError is a bad command line: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{msg: fmt.Sprintf(format, args...)} }

// env is what every command gets.
type env struct {
	environ []string
	stdout  io.Writer
	stderr  io.Writer
	opts    Options
}

// Options change what the commands run; the zero value is ratchet as
// shipped. (The chaos explorer's build of ratchet wraps the processor.)
type Options struct {
	// Processor, when set, replaces the built-in dashboard in `run`.
	Processor processor.Processor

	// exit, set by MainWith only (a process of its own), ends the process
	// when a stop of `run` outlives shutdown.timeout (stopBackstop).
	exit func(int)
}

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, e *env, args []string) error
}

func commands() []command {
	return []command{
		{"run", "run the engine (the service)", runCmd},
		{"dev", "run everything embedded: broker, demo producer, engine, page", devCmd},
		{"broker", "run the local Kafka-protocol broker", brokerCmd},
		{"produce", "produce demo or load events", produceCmd},
		{"offsets", "show stored and committed offsets, lag and would-be rewinds; 'offsets reset' moves them", offsetsCmd},
		{"dlq", "'dlq ls' summarises dead letters, 'dlq replay' re-produces them", dlqCmd},
		{"migrate", "apply the database schema", migrateCmd},
		{"pipelines", "'pipelines check' compiles the configured pipelines and checks their tables (--sample N runs them on recent records); 'status', 'reset NAME', 'forget NAME' show and remove what is recorded of each", pipelinesCmd},
		{"version", "print the version", versionCmd},
	}
}

// Main runs the command in args under SIGINT/SIGTERM and returns the exit
// code. A second signal exits at once.
func Main(args, environ []string, stdout, stderr io.Writer) int {
	return MainWith(args, environ, stdout, stderr, Options{})
}

// MainWith is Main with options.
func MainWith(args, environ []string, stdout, stderr io.Writer, o Options) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		// Exactly-once still holds after an immediate exit; an
		// at-least-once run may replay its unflushed tail.
		<-ctx.Done()
		stop()
		again := make(chan os.Signal, 1)
		signal.Notify(again, syscall.SIGINT, syscall.SIGTERM)
		<-again
		fmt.Fprintln(stderr, "ratchet: second signal, exiting now")
		os.Exit(ExitError)
	}()
	o.exit = os.Exit
	return run(ctx, args, environ, stdout, stderr, o)
}

// Run runs the command in args until ctx is done and returns the exit code.
func Run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	return run(ctx, args, environ, stdout, stderr, Options{})
}

func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer, o Options) int {
	e := &env{environ: environ, stdout: stdout, stderr: stderr, opts: o}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		printUsage(stderr)
		if len(args) == 0 {
			return ExitConfig
		}
		return ExitOK
	}
	var cmd *command
	for _, c := range commands() {
		if c.name == args[0] {
			cmd = &c
			break
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "ratchet: unknown command %q\n", args[0])
		printUsage(stderr)
		return ExitConfig
	}
	err := cmd.run(ctx, e, args[1:])
	return exitCode(stderr, err)
}

func exitCode(stderr io.Writer, err error) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	var ce *config.Error
	var ue *usageError
	switch {
	case errors.As(err, &ce):
		for _, line := range strings.Split(ce.Error(), "\n") {
			fmt.Fprintf(stderr, "ratchet: config: %s\n", line)
		}
		return ExitConfig
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "ratchet: %s\n", ue.msg)
		return ExitConfig
	default:
		fmt.Fprintf(stderr, "ratchet: %s\n", config.RedactURL(store.Explain(err).Error())) // says what to change
		return ExitError
	}
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: ratchet <command> [flags]")
	fmt.Fprintln(w)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'ratchet <command> -h' for the flags of a command.")
}

// flags returns a flag set that reports errors instead of exiting.
func flags(e *env, name string) *flag.FlagSet {
	fs := flag.NewFlagSet("ratchet "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	return fs
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usagef("%v", err)
	}
	if fs.NArg() > 0 {
		return usagef("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	return nil
}

// loadConfig loads the file (if any) and the environment.
func loadConfig(e *env, path string) (config.Config, error) {
	return config.Load(path, e.environ)
}

// newLogger builds the one logger of the process.
func newLogger(w io.Writer, cfg config.Config, forceText bool) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.Log.Level))
	opts := &slog.HandlerOptions{Level: level}
	if forceText || cfg.Log.Format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// Version is set at build time with -ldflags "-X ratchet/internal/cli.Version=...".
var Version = ""

func version() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}
