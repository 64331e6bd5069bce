package deploy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"ratchet/config"
	"ratchet/internal/cli"
	"ratchet/internal/gcpolicy"
	"ratchet/internal/web"
)

// The files under test, relative to the repository root.
const (
	composeFile    = "docker-compose.yml"
	dockerfile     = "Dockerfile"
	dockerignore   = ".dockerignore"
	imageMakefile  = "mk/image.mk"
	k8sDir         = "deploy/k8s"
	containersDoc  = "deploy/README.md" // the container image, compose and Kubernetes
	partitionsNote = "ratchet/partitions"
	// httpShutdown is how long the HTTP server waits for open requests
	// after the drain (internal/web: shutdownTimeout).
	httpShutdown = 5 * time.Second
)

// notConfig lists RATCHET_* names the files mention on purpose that are not
// configuration keys, with the reason.
var notConfig = map[string]string{
	"RATCHET_HTTP_SERVICE_HOST": "a Kubernetes service link variable, named where enableServiceLinks is explained",
	"RATCHET_SECTION_KEY":       "the README's pattern for naming variables",
	"RATCHET_ARTIFACTS_DIR":     "where tests write artifacts (docs/testing.md)",
	"RATCHET_TEST_POSTGRES_URL": "the tests' PostgreSQL server (README, Quick start)",
	"RATCHET_PIPELINES":         "named where docs/pipelines.md says pipelines are file-only (a configuration error)",
}

// root is the repository root: the tests run in deploy/.
func root(tb testing.TB) string {
	tb.Helper()
	r, err := filepath.Abs("..")
	if err != nil {
		tb.Fatalf("repository root: %v", err)
	}
	return r
}

func readFile(tb testing.TB, rel string) []byte {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(root(tb), rel))
	if err != nil {
		tb.Fatalf("read %s: %v", rel, err)
	}
	return b
}

// decodeAll decodes every YAML document of raw.
func decodeAll(raw []byte) ([]*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	var docs []*yaml.Node
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		docs = append(docs, &n)
	}
}

// envNames is the set of environment variable names the configuration
// knows.
func envNames() map[string]bool {
	out := map[string]bool{}
	for _, k := range config.Reference() {
		out[k.Env] = true
	}
	return out
}

// keyFor returns the configuration key whose variable is env.
func keyFor(env string) string {
	for _, k := range config.Reference() {
		if k.Env == env {
			return k.Key
		}
	}
	return ""
}

// ---------------------------------------------------------------------------
// docker-compose.yml

type compose struct {
	Name     string                    `yaml:"name"`
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       any               `yaml:"build"`
	Entrypoint  []string          `yaml:"entrypoint"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Ports       []string          `yaml:"ports"`
	DependsOn   map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Deploy struct {
		Replicas *int `yaml:"replicas"`
	} `yaml:"deploy"`
	StopGracePeriod string `yaml:"stop_grace_period"`
	Healthcheck     *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
	Restart string `yaml:"restart"`
}

func loadCompose(tb testing.TB) compose {
	tb.Helper()
	var c compose
	if err := yaml.Unmarshal(readFile(tb, composeFile), &c); err != nil {
		tb.Fatalf("%s: %v", composeFile, err)
	}
	return c
}

// interpolation matches the compose variable forms used: ${VAR},
// ${VAR:-default} and ${VAR-default}.
var interpolation = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}`)

// interpolate expands s as compose does with no variables set: every
// reference takes its default. $$ is a literal $.
func interpolate(tb testing.TB, s string) string {
	tb.Helper()
	s = strings.ReplaceAll(s, "$$", "\x00")
	s = interpolation.ReplaceAllString(s, "$2")
	if strings.Contains(s, "$") {
		tb.Fatalf("unsupported variable reference in %q (use ${VAR:-default})", s)
	}
	return strings.ReplaceAll(s, "\x00", "$")
}

// serviceEnv is the environment a compose service's container sees: the
// image's ENV (for ratchet:local, the Dockerfile's) and then the service's
// environment, interpolated.
func serviceEnv(tb testing.TB, s composeService) []string {
	tb.Helper()
	var env []string
	if s.Image == "ratchet:local" {
		env = append(env, parseDockerfile(tb).env...)
	}
	keys := make([]string, 0, len(s.Environment))
	for k := range s.Environment {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+interpolate(tb, s.Environment[k]))
	}
	return env
}

func loadConfig(tb testing.TB, where string, env []string) config.Config {
	tb.Helper()
	cfg, err := config.Load("", env)
	if err != nil {
		tb.Fatalf("%s: the configuration does not load:\n%v", where, err)
	}
	return cfg
}

// topicPartitions parses the topics job's script: for every
// `kafka-topics.sh ... --create ... --topic T ... --partitions N` line it
// returns T -> N.
func topicPartitions(tb testing.TB, job composeService) map[string]int {
	tb.Helper()
	out := map[string]int{}
	script := strings.Join(append(slices.Clone(job.Entrypoint), job.Command...), "\n")
	for _, line := range strings.Split(script, "\n") {
		f := strings.Fields(line)
		if !slices.Contains(f, "--create") {
			continue
		}
		topic, parts := "", -1
		for i := 0; i+1 < len(f); i++ {
			switch f[i] {
			case "--topic":
				topic = f[i+1]
			case "--partitions":
				n, err := strconv.Atoi(f[i+1])
				if err != nil {
					tb.Fatalf("topics job: --partitions %q: %v", f[i+1], err)
				}
				parts = n
			}
		}
		if topic == "" || parts < 1 {
			tb.Fatalf("topics job: a --create line without --topic and --partitions: %q", line)
		}
		out[topic] = parts
	}
	return out
}

func TestComposeRatchetConfiguration(t *testing.T) {
	c := loadCompose(t)
	for _, name := range []string{"kafka", "topics", "postgres", "ratchet", "producer"} {
		if _, ok := c.Services[name]; !ok {
			t.Fatalf("%s: no service %q", composeFile, name)
		}
	}
	r := c.Services["ratchet"]
	cfg := loadConfig(t, composeFile+" ratchet", serviceEnv(t, r))

	t.Run("command", func(t *testing.T) {
		assertCommand(t, composeFile+" ratchet", r.Command)
		assertCommand(t, composeFile+" producer", c.Services["producer"].Command)
		if got := c.Services["producer"].Command; len(got) == 0 || got[0] != "produce" {
			t.Errorf("producer command %q: want the produce command", got)
		}
	})
	t.Run("producer configuration", func(t *testing.T) {
		pcfg := loadConfig(t, composeFile+" producer", serviceEnv(t, c.Services["producer"]))
		if !slices.Equal(pcfg.Kafka.Brokers, cfg.Kafka.Brokers) || pcfg.Kafka.Topics[0] != cfg.Kafka.Topics[0] {
			t.Errorf("producer writes to %v %v, ratchet reads %v %v", pcfg.Kafka.Brokers, pcfg.Kafka.Topics, cfg.Kafka.Brokers, cfg.Kafka.Topics)
		}
	})
	t.Run("exactly-once", func(t *testing.T) {
		if cfg.Commit.Mode != config.ModeExactlyOnce {
			t.Errorf("commit.mode %q, want %q", cfg.Commit.Mode, config.ModeExactlyOnce)
		}
	})
	t.Run("brokers are the kafka service", func(t *testing.T) {
		for _, b := range cfg.Kafka.Brokers {
			host, _, _ := net.SplitHostPort(b)
			if _, ok := c.Services[host]; !ok {
				t.Errorf("kafka.brokers %q: no compose service %q", b, host)
			}
			if !strings.Contains(strings.Join(c.Services["kafka"].envList(), " "), "://"+b) {
				t.Errorf("kafka.brokers %q is not an advertised listener of the kafka service", b)
			}
		}
	})
	t.Run("ports", func(t *testing.T) {
		port := httpPort(t, cfg)
		if len(r.Ports) == 0 {
			t.Fatal("ratchet publishes no port")
		}
		for _, p := range r.Ports {
			parts := strings.Split(p, ":")
			target := parts[len(parts)-1]
			if target != strconv.Itoa(port) {
				t.Errorf("port %q targets %s, ratchet listens on %d", p, target, port)
			}
			if replicas(r) > 1 && len(parts) >= 2 && parts[len(parts)-2] != "" && !strings.Contains(parts[len(parts)-2], "-") {
				t.Errorf("port %q: a fixed host port cannot be shared by %d replicas", p, replicas(r))
			}
		}
	})
	t.Run("replicas within partitions", func(t *testing.T) {
		parts := topicPartitions(t, c.Services["topics"])
		for _, topic := range cfg.Kafka.Topics {
			n, ok := parts[topic]
			if !ok {
				t.Fatalf("the topics job does not create input topic %q (creates %v)", topic, parts)
			}
			if replicas(r) > n {
				t.Errorf("ratchet replicas %d > %d partitions of %q: the extra members would idle", replicas(r), n, topic)
			}
			if _, ok := parts[cfg.Kafka.DLQTopic(topic)]; !ok {
				t.Errorf("the topics job does not create the dead-letter topic %q", cfg.Kafka.DLQTopic(topic))
			}
		}
		if got := c.Services["kafka"].Environment["KAFKA_AUTO_CREATE_TOPICS_ENABLE"]; got != "false" {
			t.Errorf("KAFKA_AUTO_CREATE_TOPICS_ENABLE=%q: auto-created topics would not have the job's partition count", got)
		}
	})
	t.Run("stop grace period", func(t *testing.T) {
		grace, err := time.ParseDuration(r.StopGracePeriod)
		if err != nil {
			t.Fatalf("stop_grace_period %q: %v", r.StopGracePeriod, err)
		}
		if min := cfg.Shutdown.Timeout + httpShutdown; grace <= min {
			t.Errorf("stop_grace_period %s <= shutdown.timeout %s + %s: the drain can be cut by SIGKILL", grace, cfg.Shutdown.Timeout, httpShutdown)
		}
	})
	t.Run("depends_on", func(t *testing.T) {
		want := map[string]map[string]string{
			"topics":   {"kafka": "service_healthy"},
			"ratchet":  {"topics": "service_completed_successfully", "postgres": "service_healthy"},
			"producer": {"topics": "service_completed_successfully"},
		}
		for svc, deps := range want {
			for dep, cond := range deps {
				if got := c.Services[svc].DependsOn[dep].Condition; got != cond {
					t.Errorf("%s depends_on %s: condition %q, want %q", svc, dep, got, cond)
				}
			}
		}
		if hc := c.Services["postgres"].Healthcheck; hc == nil || !strings.Contains(strings.Join(hc.Test, " "), "pg_isready") {
			t.Error("postgres has no pg_isready healthcheck")
		}
		if c.Services["kafka"].Healthcheck == nil {
			t.Error("kafka has no healthcheck")
		}
		if c.Services["ratchet"].Healthcheck != nil {
			t.Error("ratchet has a healthcheck, but its distroless image has no shell or HTTP client to run one")
		}
		if got := c.Services["topics"].Restart; got != "no" {
			t.Errorf("topics restart %q: a one-shot job must not restart", got)
		}
	})
	t.Run("postgres url matches the postgres service", func(t *testing.T) {
		pg := c.Services["postgres"]
		url := cfg.Postgres.URL.Reveal()
		for _, part := range []string{
			"://" + interpolate(t, pg.Environment["POSTGRES_USER"]) + ":" + interpolate(t, pg.Environment["POSTGRES_PASSWORD"]) + "@postgres:5432/",
			"/" + interpolate(t, pg.Environment["POSTGRES_DB"]) + "?",
		} {
			if !strings.Contains(url, part) {
				t.Errorf("postgres.url %s does not contain %q from the postgres service", cfg.Postgres.URL, part)
			}
		}
	})
}

func (s composeService) envList() []string {
	out := make([]string, 0, len(s.Environment))
	for k, v := range s.Environment {
		out = append(out, k+"="+v)
	}
	return out
}

func replicas(s composeService) int {
	if s.Deploy.Replicas == nil {
		return 1
	}
	return *s.Deploy.Replicas
}

// assertCommand checks that args name a ratchet command and flags it
// accepts: `ratchet <args...> -h` must succeed (it prints the usage and exits
// 0; an unknown command or flag exits 2).
func assertCommand(tb testing.TB, where string, args []string) {
	tb.Helper()
	if len(args) == 0 {
		tb.Errorf("%s: no command", where)
		return
	}
	// Only the flag names are checked: keep each flag, drop its value.
	probe := []string{args[0]}
	for _, a := range args[1:] {
		if strings.HasPrefix(a, "-") {
			probe = append(probe, strings.SplitN(a, "=", 2)[0])
		}
	}
	var stderr bytes.Buffer
	usage := func(cmd string) string {
		stderr.Reset()
		cli.Run(context.Background(), []string{cmd, "-h"}, nil, io.Discard, &stderr)
		return stderr.String()
	}
	help := usage(probe[0])
	if strings.Contains(help, "unknown command") {
		tb.Errorf("%s: %q is not a ratchet command", where, probe[0])
		return
	}
	for _, f := range probe[1:] {
		name := strings.TrimLeft(f, "-")
		if !regexp.MustCompile(`(?m)^\s+-` + regexp.QuoteMeta(name) + `\b`).MatchString(help) {
			tb.Errorf("%s: ratchet %s has no flag -%s", where, probe[0], name)
		}
	}
}

// httpPort is the port of cfg's http.addr.
func httpPort(tb testing.TB, cfg config.Config) int {
	tb.Helper()
	_, p, err := net.SplitHostPort(cfg.HTTP.Addr)
	if err != nil {
		tb.Fatalf("http.addr %q: %v", cfg.HTTP.Addr, err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

// ---------------------------------------------------------------------------
// Dockerfile and .dockerignore

type dockerImage struct {
	stages     []string // FROM lines
	final      string   // base image of the last stage
	env        []string // ENV of the last stage, KEY=VALUE
	user       string
	expose     []string
	entrypoint []string
	cmd        []string
	copies     []string // COPY lines of the last stage
	runs       []string // RUN instructions of every stage
}

// parseDockerfile reads the Dockerfile's instructions (continuation lines
// joined, comments dropped).
func parseDockerfile(tb testing.TB) dockerImage {
	tb.Helper()
	var lines []string
	var cur strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(readFile(tb, dockerfile)))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(l, "#") || (l == "" && cur.Len() == 0) {
			continue
		}
		if s, ok := strings.CutSuffix(l, `\`); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(l)
		lines = append(lines, cur.String())
		cur.Reset()
	}
	var img dockerImage
	for _, l := range lines {
		instr, rest, _ := strings.Cut(l, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(instr) {
		case "FROM":
			img.stages = append(img.stages, rest)
			img.final = strings.Fields(rest)[0]
			img.env, img.user, img.expose, img.entrypoint, img.cmd, img.copies = nil, "", nil, nil, nil, nil
		case "ENV":
			for _, kv := range strings.Fields(rest) {
				if !strings.Contains(kv, "=") {
					tb.Fatalf("Dockerfile: ENV %q: use the KEY=VALUE form", rest)
				}
				img.env = append(img.env, kv)
			}
		case "USER":
			img.user = rest
		case "EXPOSE":
			img.expose = strings.Fields(rest)
		case "ENTRYPOINT":
			img.entrypoint = execForm(tb, "ENTRYPOINT", rest)
		case "CMD":
			img.cmd = execForm(tb, "CMD", rest)
		case "COPY":
			img.copies = append(img.copies, rest)
		case "RUN":
			img.runs = append(img.runs, rest)
		}
	}
	return img
}

func execForm(tb testing.TB, instr, rest string) []string {
	tb.Helper()
	var v []string
	if err := json.Unmarshal([]byte(rest), &v); err != nil {
		tb.Fatalf("Dockerfile: %s %s: use the exec (JSON) form: %v", instr, rest, err)
	}
	return v
}

func TestDockerfile(t *testing.T) {
	img := parseDockerfile(t)
	cfg := loadConfig(t, "Dockerfile ENV", img.env)

	if len(img.stages) < 2 || !strings.HasPrefix(img.stages[0], "golang:") {
		t.Errorf("stages %q: want a golang builder, then the runtime", img.stages)
	}
	if !strings.HasPrefix(img.final, "gcr.io/distroless/static") || !strings.HasSuffix(img.final, ":nonroot") {
		t.Errorf("runtime image %q: want gcr.io/distroless/static-*:nonroot", img.final)
	}
	if img.user != "65532:65532" {
		t.Errorf("USER %q: want the numeric nonroot user 65532:65532 (runAsNonRoot needs a number)", img.user)
	}
	if !slices.Equal(img.entrypoint, []string{"/ratchet"}) || !slices.Equal(img.cmd, []string{"run"}) {
		t.Errorf("ENTRYPOINT %q CMD %q: want [/ratchet] [run]", img.entrypoint, img.cmd)
	}
	assertCommand(t, "Dockerfile CMD", img.cmd)
	host, _, _ := net.SplitHostPort(cfg.HTTP.Addr)
	if host != "0.0.0.0" {
		t.Errorf("http.addr %q in the image: probes from outside the container need 0.0.0.0", cfg.HTTP.Addr)
	}
	if want := strconv.Itoa(httpPort(t, cfg)); !slices.Equal(img.expose, []string{want}) {
		t.Errorf("EXPOSE %q: ratchet listens on %s", img.expose, want)
	}

	// The builder runs the same target as the static-binary test, into the
	// path the runtime stage copies from.
	var build string
	for _, r := range img.runs {
		if strings.Contains(r, "image-binary") {
			build = r
		}
	}
	m := regexp.MustCompile(`make -f mk/image\.mk image-binary STATIC_BIN=(\S+)`).FindStringSubmatch(build)
	if m == nil {
		t.Fatalf("no RUN make -f mk/image.mk image-binary STATIC_BIN=...: the image must build what the tests build")
	}
	if !slices.ContainsFunc(img.copies, func(c string) bool { return c == "--from=build "+m[1]+" /ratchet" }) {
		t.Errorf("the runtime stage does not COPY --from=build %s /ratchet (copies: %q)", m[1], img.copies)
	}
	if !slices.ContainsFunc(img.runs, func(r string) bool { return strings.Contains(r, "install") && strings.Contains(r, "musl-tools") }) {
		t.Error("the builder does not install musl-tools")
	}

	mk := string(readFile(t, imageMakefile))
	for _, want := range []string{
		`CC=musl-gcc CGO_ENABLED=1 $(GO) build`,
		`STATIC_TAGS    := musl`,
		`-linkmode external -extldflags "-static" -s -w`,
		`./cmd/ratchet`,
	} {
		if !strings.Contains(mk, want) {
			t.Errorf("%s does not contain %q", imageMakefile, want)
		}
	}
}

// ignoreRule is one .dockerignore pattern as a regular expression over
// slash-separated paths relative to the context root.
type ignoreRule struct {
	pattern string
	re      *regexp.Regexp
	negate  bool
}

func dockerignoreRules(tb testing.TB) []ignoreRule {
	tb.Helper()
	var rules []ignoreRule
	sc := bufio.NewScanner(bytes.NewReader(readFile(tb, dockerignore)))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		r := ignoreRule{pattern: l}
		if s, ok := strings.CutPrefix(l, "!"); ok {
			r.negate, l = true, s
		}
		l = strings.Trim(filepath.ToSlash(filepath.Clean(l)), "/")
		var re strings.Builder
		re.WriteString("^")
		for i := 0; i < len(l); i++ {
			switch {
			case strings.HasPrefix(l[i:], "**/"):
				re.WriteString("(?:.*/)?")
				i += 2
			case strings.HasPrefix(l[i:], "**"):
				re.WriteString(".*")
				i++
			case l[i] == '*':
				re.WriteString("[^/]*")
			case l[i] == '?':
				re.WriteString("[^/]")
			default:
				re.WriteString(regexp.QuoteMeta(string(l[i])))
			}
		}
		re.WriteString("$")
		r.re = regexp.MustCompile(re.String())
		rules = append(rules, r)
	}
	return rules
}

// ignored reports whether path (or a directory above it) is excluded from
// the build context. The last matching rule wins, as in Docker.
func ignored(rules []ignoreRule, path string) (bool, string) {
	parts := strings.Split(path, "/")
	out, by := false, ""
	for _, r := range rules {
		for i := 1; i <= len(parts); i++ {
			if r.re.MatchString(strings.Join(parts[:i], "/")) {
				out, by = !r.negate, r.pattern
				break
			}
		}
	}
	return out, by
}

func TestDockerignoreKeepsBuildInputs(t *testing.T) {
	rules := dockerignoreRules(t)
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go not on PATH: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "list", "-tags", "musl", "-deps", "-json=Dir,Module,GoFiles,CgoFiles,EmbedFiles,HFiles,CFiles", "./cmd/ratchet")
	cmd.Dir = root(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	need := []string{"go.mod", "go.sum", imageMakefile}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct {
			Dir    string
			Module *struct{ Path string }
			GoFiles, CgoFiles, EmbedFiles,
			HFiles, CFiles []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("go list output: %v", err)
		}
		if p.Module == nil || p.Module.Path != "ratchet" {
			continue
		}
		rel, err := filepath.Rel(root(t), p.Dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range slices.Concat(p.GoFiles, p.CgoFiles, p.EmbedFiles, p.HFiles, p.CFiles) {
			need = append(need, filepath.ToSlash(filepath.Join(rel, f)))
		}
	}
	if len(need) < 10 {
		t.Fatalf("go list found only %v", need)
	}
	for _, f := range need {
		if out, by := ignored(rules, f); out {
			t.Errorf("%s excludes %s (pattern %q), which the image build needs", dockerignore, f, by)
		}
	}
	for _, f := range []string{".git/HEAD", "bin/ratchet-static", "internal/event/testdata/fuzz/x"} {
		if out, _ := ignored(rules, f); !out {
			t.Errorf("%s does not exclude %s", dockerignore, f)
		}
	}
}

// ---------------------------------------------------------------------------
// Kubernetes manifests

type k8sDoc struct {
	file string
	obj  k8sObject
	node *yaml.Node
}

type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name        string            `yaml:"name"`
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	} `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
	StringData map[string]string `yaml:"stringData"`
	Resources  []string          `yaml:"resources"` // Kustomization
}

type statefulSet struct {
	Spec struct {
		Replicas            *int   `yaml:"replicas"`
		ServiceName         string `yaml:"serviceName"`
		PodManagementPolicy string `yaml:"podManagementPolicy"`
		Selector            struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec podSpec `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type podSpec struct {
	TerminationGracePeriodSeconds *int  `yaml:"terminationGracePeriodSeconds"`
	EnableServiceLinks            *bool `yaml:"enableServiceLinks"`
	SecurityContext               struct {
		RunAsNonRoot *bool `yaml:"runAsNonRoot"`
		RunAsUser    *int  `yaml:"runAsUser"`
	} `yaml:"securityContext"`
	Containers []container `yaml:"containers"`
}

type container struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	EnvFrom []struct {
		ConfigMapRef *struct {
			Name string `yaml:"name"`
		} `yaml:"configMapRef"`
		SecretRef *struct {
			Name string `yaml:"name"`
		} `yaml:"secretRef"`
	} `yaml:"envFrom"`
	Env []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			FieldRef *struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	StartupProbe   *probe `yaml:"startupProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"` // a number or a port name
	} `yaml:"httpGet"`
}

type service struct {
	Spec struct {
		ClusterIP string            `yaml:"clusterIP"`
		Selector  map[string]string `yaml:"selector"`
		Ports     []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort string `yaml:"targetPort"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

type pdb struct {
	Spec struct {
		MaxUnavailable any `yaml:"maxUnavailable"`
		Selector       struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
	} `yaml:"spec"`
}

type scaler struct {
	Spec struct {
		ScaleTargetRef struct {
			Kind string `yaml:"kind"`
			Name string `yaml:"name"`
		} `yaml:"scaleTargetRef"`
		MaxReplicas     *int `yaml:"maxReplicas"`     // HPA
		MaxReplicaCount *int `yaml:"maxReplicaCount"` // KEDA ScaledObject
		Triggers        []struct {
			Type     string            `yaml:"type"`
			Metadata map[string]string `yaml:"metadata"`
		} `yaml:"triggers"`
	} `yaml:"spec"`
}

// loadK8s decodes every document of every YAML file under deploy/k8s.
func loadK8s(tb testing.TB) []k8sDoc {
	tb.Helper()
	dir := filepath.Join(root(tb), k8sDir)
	var docs []k8sDoc
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || (!strings.HasSuffix(path, ".yaml") && !strings.HasSuffix(path, ".yml")) {
			return err
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		nodes, err := decodeAll(raw)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		for _, n := range nodes {
			var o k8sObject
			if err := n.Decode(&o); err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
			docs = append(docs, k8sDoc{file: filepath.ToSlash(rel), obj: o, node: n})
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("%s: %v", k8sDir, err)
	}
	if len(docs) == 0 {
		tb.Fatalf("no manifests under %s", k8sDir)
	}
	return docs
}

func find(docs []k8sDoc, kind string) []k8sDoc {
	var out []k8sDoc
	for _, d := range docs {
		if d.obj.Kind == kind {
			out = append(out, d)
		}
	}
	return out
}

func one(tb testing.TB, docs []k8sDoc, kind string) k8sDoc {
	tb.Helper()
	found := find(docs, kind)
	if len(found) != 1 {
		tb.Fatalf("%s: want exactly one %s, found %d", k8sDir, kind, len(found))
	}
	return found[0]
}

func decodeAs[T any](tb testing.TB, d k8sDoc) T {
	tb.Helper()
	var v T
	if err := d.node.Decode(&v); err != nil {
		tb.Fatalf("%s %s: %v", d.file, d.obj.Kind, err)
	}
	return v
}

func byName(tb testing.TB, docs []k8sDoc, kind, name string) k8sDoc {
	tb.Helper()
	for _, d := range find(docs, kind) {
		if d.obj.Metadata.Name == name {
			return d
		}
	}
	tb.Fatalf("%s: no %s named %q", k8sDir, kind, name)
	return k8sDoc{}
}

// podEnv is the environment of the ratchet container as Kubernetes builds
// it: the image's ENV, then envFrom in order, then env. Values from the
// downward API take instance as the pod name.
func podEnv(tb testing.TB, docs []k8sDoc, c container, instance string) []string {
	tb.Helper()
	env := slices.Clone(parseDockerfile(tb).env)
	add := func(m map[string]string) {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			env = append(env, k+"="+m[k])
		}
	}
	for _, ef := range c.EnvFrom {
		switch {
		case ef.ConfigMapRef != nil:
			add(byName(tb, docs, "ConfigMap", ef.ConfigMapRef.Name).obj.Data)
		case ef.SecretRef != nil:
			add(byName(tb, docs, "Secret", ef.SecretRef.Name).obj.StringData)
		}
	}
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name" {
			v = instance
		}
		env = append(env, e.Name+"="+v)
	}
	// Later entries win, as in Kubernetes; config.Load reads them in order
	// into a map, so drop the shadowed ones first.
	seen := map[string]bool{}
	var out []string
	for i := len(env) - 1; i >= 0; i-- {
		k, _, _ := strings.Cut(env[i], "=")
		if !seen[k] {
			seen[k] = true
			out = append(out, env[i])
		}
	}
	slices.Reverse(out)
	return out
}

// mebibytes parses a Kubernetes memory quantity in Ki, Mi or Gi.
func mebibytes(tb testing.TB, q string) float64 {
	tb.Helper()
	for suffix, mult := range map[string]float64{"Ki": 1.0 / 1024, "Mi": 1, "Gi": 1024} {
		if s, ok := strings.CutSuffix(q, suffix); ok {
			n, err := strconv.ParseFloat(s, 64)
			if err == nil {
				return n * mult
			}
		}
	}
	tb.Fatalf("memory quantity %q: use Ki, Mi or Gi", q)
	return 0
}

func TestK8sManifestsParse(t *testing.T) {
	for _, d := range loadK8s(t) {
		if d.obj.APIVersion == "" || d.obj.Kind == "" {
			t.Errorf("%s: a document without apiVersion and kind", d.file)
		}
		if d.obj.Kind != "Kustomization" && d.obj.Metadata.Name == "" {
			t.Errorf("%s: %s without metadata.name", d.file, d.obj.Kind)
		}
	}
}

func TestK8sKustomizationListsTheBase(t *testing.T) {
	docs := loadK8s(t)
	k := one(t, docs, "Kustomization")
	entries, err := os.ReadDir(filepath.Join(root(t), k8sDir))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".yaml") && e.Name() != "kustomization.yaml" {
			want = append(want, e.Name())
		}
	}
	got := slices.Sorted(slices.Values(k.obj.Resources))
	if !slices.Equal(got, want) {
		t.Errorf("kustomization resources %q, want the base manifests %q", got, want)
	}
}

func TestK8sStatefulSet(t *testing.T) {
	docs := loadK8s(t)
	stsDoc := one(t, docs, "StatefulSet")
	sts := decodeAs[statefulSet](t, stsDoc)
	pod := sts.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("want one container, found %d", len(pod.Containers))
	}
	c := pod.Containers[0]
	env := podEnv(t, docs, c, stsDoc.obj.Metadata.Name+"-0")
	cfg := loadConfig(t, "StatefulSet environment", env)

	t.Run("replicas within partitions", func(t *testing.T) {
		parts := documentedPartitions(t, stsDoc)
		if sts.Spec.Replicas == nil || *sts.Spec.Replicas < 1 {
			t.Fatal("spec.replicas is not set")
		}
		if *sts.Spec.Replicas > parts {
			t.Errorf("replicas %d > %d partitions: the extra pods would idle", *sts.Spec.Replicas, parts)
		}
	})
	t.Run("instance id is the pod name", func(t *testing.T) {
		ok := false
		for _, e := range c.Env {
			if e.Name == "RATCHET_KAFKA_INSTANCE_ID" {
				ok = e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name"
			}
		}
		if !ok {
			t.Error("RATCHET_KAFKA_INSTANCE_ID does not come from the downward API metadata.name")
		}
		if cfg.Kafka.InstanceID != stsDoc.obj.Metadata.Name+"-0" {
			t.Errorf("kafka.instance_id %q, want the pod name", cfg.Kafka.InstanceID)
		}
	})
	t.Run("probes", func(t *testing.T) {
		served := servedPaths(t)
		port := httpPort(t, cfg)
		for name, want := range map[string]struct {
			p    *probe
			path string
		}{
			"readinessProbe": {c.ReadinessProbe, "/readyz"},
			"livenessProbe":  {c.LivenessProbe, "/healthz"},
			"startupProbe":   {c.StartupProbe, "/healthz"},
		} {
			if want.p == nil || want.p.HTTPGet == nil {
				t.Errorf("%s: want an httpGet probe on %s", name, want.path)
				continue
			}
			g := want.p.HTTPGet
			if g.Path != want.path {
				t.Errorf("%s path %q, want %q", name, g.Path, want.path)
			}
			if code, ok := served[g.Path]; !ok || code != http.StatusOK {
				t.Errorf("%s path %q: the server answers %d when ready", name, g.Path, code)
			}
			if got := containerPort(t, c, g.Port); got != port {
				t.Errorf("%s port %q is %d, ratchet listens on %d", name, g.Port, got, port)
			}
		}
	})
	t.Run("termination grace period", func(t *testing.T) {
		if pod.TerminationGracePeriodSeconds == nil {
			t.Fatal("terminationGracePeriodSeconds is not set (the default 30s is not more than shutdown.timeout)")
		}
		grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
		if min := cfg.Shutdown.Timeout + httpShutdown; grace <= min {
			t.Errorf("terminationGracePeriodSeconds %s <= shutdown.timeout %s + %s", grace, cfg.Shutdown.Timeout, httpShutdown)
		}
	})
	t.Run("resources", func(t *testing.T) {
		req, lim := c.Resources.Requests["memory"], c.Resources.Limits["memory"]
		if req == "" || lim == "" {
			t.Fatalf("memory request %q limit %q: both must be set", req, lim)
		}
		// ratchet stays below 200 MiB RSS at the default settings.
		r, l := mebibytes(t, req), mebibytes(t, lim)
		if r < 200 || l < 2*r {
			t.Errorf("memory request %s, limit %s: want a request of at least 200Mi and twice that as the limit", req, lim)
		}
		// Under load the Go heap reaches its soft limit (GOMEMLIMIT, or the
		// one ratchet sets from the budget), and librdkafka's buffers and
		// the binary come on top: up to 85 MiB with 1,024 partitions. That
		// must fit the request, and leave 128 MiB of the limit
		// (deploy/README.md, Sizing).
		soft := float64(gcpolicy.Limit(int64(cfg.Processing.MemoryBudget))) / (1 << 20)
		for _, kv := range env {
			if v, ok := strings.CutPrefix(kv, "GOMEMLIMIT="); ok {
				soft = mebibytes(t, strings.TrimSuffix(v, "B"))
			}
		}
		if soft+85 > r || soft+128 > l {
			t.Errorf("soft memory limit %.0f MiB: want at most the memory request %s less 85 MiB and the limit %s less 128 MiB", soft, req, lim)
		}
	})
	t.Run("security context", func(t *testing.T) {
		sc := c.SecurityContext
		if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || !slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) {
			t.Errorf("container securityContext %+v: want runAsNonRoot, readOnlyRootFilesystem, no privilege escalation, drop ALL", sc)
		}
		user := strings.Split(parseDockerfile(t).user, ":")[0]
		if u := pod.SecurityContext.RunAsUser; u == nil || strconv.Itoa(*u) != user {
			t.Errorf("pod runAsUser is not the image's user %s", user)
		}
	})
	t.Run("service links off", func(t *testing.T) {
		if pod.EnableServiceLinks == nil || *pod.EnableServiceLinks {
			t.Error("enableServiceLinks is not false: service variables could collide with RATCHET_* keys")
		}
	})
	t.Run("command", func(t *testing.T) {
		assertCommand(t, "StatefulSet args", c.Args)
	})
	t.Run("governing service", func(t *testing.T) {
		svc := decodeAs[service](t, byName(t, docs, "Service", sts.Spec.ServiceName))
		if svc.Spec.ClusterIP != "None" {
			t.Errorf("service %q clusterIP %q: the StatefulSet's service must be headless", sts.Spec.ServiceName, svc.Spec.ClusterIP)
		}
		labels := sts.Spec.Template.Metadata.Labels
		if !selects(svc.Spec.Selector, labels) || !selects(sts.Spec.Selector.MatchLabels, labels) {
			t.Errorf("selectors %v / %v do not select the pod labels %v", svc.Spec.Selector, sts.Spec.Selector.MatchLabels, labels)
		}
		for _, p := range svc.Spec.Ports {
			if containerPort(t, c, p.TargetPort) != httpPort(t, cfg) || p.Port != httpPort(t, cfg) {
				t.Errorf("service port %+v does not reach ratchet's port %d", p, httpPort(t, cfg))
			}
		}
	})
	t.Run("disruption budget", func(t *testing.T) {
		b := decodeAs[pdb](t, one(t, docs, "PodDisruptionBudget"))
		if fmt.Sprint(b.Spec.MaxUnavailable) != "1" {
			t.Errorf("maxUnavailable %v, want 1", b.Spec.MaxUnavailable)
		}
		if !selects(b.Spec.Selector.MatchLabels, sts.Spec.Template.Metadata.Labels) {
			t.Errorf("the PodDisruptionBudget selector %v does not select the pods", b.Spec.Selector.MatchLabels)
		}
	})
}

// documentedPartitions is the ratchet/partitions annotation of the
// StatefulSet: the partition count of the input topic.
func documentedPartitions(tb testing.TB, sts k8sDoc) int {
	tb.Helper()
	n, err := strconv.Atoi(sts.obj.Metadata.Annotations[partitionsNote])
	if err != nil || n < 1 {
		tb.Fatalf("StatefulSet annotation %s=%q: want the partition count of the input topic", partitionsNote, sts.obj.Metadata.Annotations[partitionsNote])
	}
	return n
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// containerPort resolves a probe or service port (a number or a port name)
// to the container's port number.
func containerPort(tb testing.TB, c container, port string) int {
	tb.Helper()
	if n, err := strconv.Atoi(port); err == nil {
		return n
	}
	for _, p := range c.Ports {
		if p.Name == port {
			return p.ContainerPort
		}
	}
	tb.Errorf("port %q: the container has no port of that name", port)
	return 0
}

func TestK8sAutoscalersCapped(t *testing.T) {
	docs := loadK8s(t)
	stsDoc := one(t, docs, "StatefulSet")
	parts := documentedPartitions(t, stsDoc)
	cm := byName(t, docs, "ConfigMap", "ratchet-config").obj.Data
	scalers := append(find(docs, "HorizontalPodAutoscaler"), find(docs, "ScaledObject")...)
	if len(scalers) == 0 {
		t.Fatal("no autoscaling example")
	}
	for _, d := range scalers {
		t.Run(d.file, func(t *testing.T) {
			s := decodeAs[scaler](t, d)
			if s.Spec.ScaleTargetRef.Kind != "StatefulSet" || s.Spec.ScaleTargetRef.Name != stsDoc.obj.Metadata.Name {
				t.Errorf("scaleTargetRef %+v, want the StatefulSet %q", s.Spec.ScaleTargetRef, stsDoc.obj.Metadata.Name)
			}
			max := s.Spec.MaxReplicas
			if d.obj.Kind == "ScaledObject" {
				max = s.Spec.MaxReplicaCount
			}
			if max == nil {
				t.Errorf("no maximum replica count: want at most the %d partitions", parts)
			} else if *max > parts {
				t.Errorf("max replicas %d: want at most the %d partitions", *max, parts)
			}
			for _, tr := range s.Spec.Triggers {
				if tr.Type != "kafka" {
					continue
				}
				if tr.Metadata["consumerGroup"] != cm["RATCHET_KAFKA_GROUP_ID"] || tr.Metadata["topic"] != cm["RATCHET_KAFKA_TOPICS"] {
					t.Errorf("kafka trigger group %q topic %q, want the ConfigMap's %q %q", tr.Metadata["consumerGroup"],
						tr.Metadata["topic"], cm["RATCHET_KAFKA_GROUP_ID"], cm["RATCHET_KAFKA_TOPICS"])
				}
				if tr.Metadata["allowIdleConsumers"] == "true" {
					t.Error("allowIdleConsumers true would scale past the partition count")
				}
			}
		})
	}
}

// TestK8sServiceLinksCannotCollide checks the Service names against the
// variables Kubernetes would inject if service links were on: a Service
// named ratchet-http would give RATCHET_HTTP_SERVICE_HOST, an unknown key of
// the http section, which ratchet refuses with exit code 2.
func TestK8sServiceLinksCannotCollide(t *testing.T) {
	sections := map[string]bool{}
	for _, k := range config.Reference() {
		sections[strings.ToUpper(strings.SplitN(k.Key, ".", 2)[0])] = true
	}
	for _, d := range find(loadK8s(t), "Service") {
		prefix := strings.ToUpper(strings.ReplaceAll(d.obj.Metadata.Name, "-", "_")) + "_SERVICE_HOST"
		rest, ok := strings.CutPrefix(prefix, "RATCHET_")
		if section, _, _ := strings.Cut(rest, "_"); ok && sections[section] {
			t.Errorf("Service %q would inject %s, an unknown key of the %s section", d.obj.Metadata.Name, prefix, strings.ToLower(section))
		}
	}
}

// ---------------------------------------------------------------------------
// Across files

// TestEnvNamesExist checks every RATCHET_* name in the deployment files and
// their documentation against the configuration reference.
func TestEnvNamesExist(t *testing.T) {
	known := envNames()
	// The README and docs/ name variables too (configuration, operations,
	// tests); a name that drifts there misleads as much as in a manifest.
	files := []string{composeFile, dockerfile, imageMakefile, containersDoc, "README.md", "bench/README.md"}
	docs, err := filepath.Glob(filepath.Join(root(t), "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		rel, _ := filepath.Rel(root(t), d)
		files = append(files, rel)
	}
	err = filepath.WalkDir(filepath.Join(root(t), k8sDir), func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(root(t), path)
			files = append(files, rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`RATCHET_[A-Z0-9_]*[A-Z0-9]`)
	total := 0
	for _, f := range files {
		for _, n := range name.FindAllString(string(readFile(t, f)), -1) {
			total++
			if !known[n] && notConfig[n] == "" {
				t.Errorf("%s: %s is not a configuration variable (config.Reference)", f, n)
			}
		}
	}
	if total < 10 {
		t.Errorf("found only %d RATCHET_* names; is the pattern right?", total)
	}
	for n := range notConfig {
		if known[n] {
			t.Errorf("%s is in notConfig but is a configuration variable of %s", n, keyFor(n))
		}
	}
}

// readySource is a web.Source whose readiness is settable.
type readySource struct{ state web.ReadinessState }

func (s readySource) Pipeline(context.Context) (web.Pipeline, error) { return web.Pipeline{}, nil }
func (s readySource) Rollups(context.Context, time.Time) ([]web.Rollup, error) {
	return nil, nil
}
func (s readySource) Readiness() web.Readiness { return web.Readiness{State: s.state} }

// servedPaths asks the real HTTP handler for the probe and metrics paths
// and returns their status codes while the instance is ready.
func servedPaths(tb testing.TB) map[string]int {
	tb.Helper()
	get := func(state web.ReadinessState, path string) int {
		h := web.New(web.Options{Source: readySource{state: state}}).Handler()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code
	}
	out := map[string]int{}
	for _, p := range []string{"/healthz", "/readyz", "/metrics", "/"} {
		out[p] = get(web.StateReady, p)
	}
	if code := get(web.StateStarting, "/readyz"); code != http.StatusServiceUnavailable {
		tb.Errorf("/readyz while starting answers %d, want 503", code)
	}
	if code := get(web.StateIdle, "/readyz"); code != http.StatusOK {
		tb.Errorf("/readyz while idle answers %d, want 200 (idle members must not block rollouts)", code)
	}
	if code := get(web.StateStarting, "/healthz"); code != http.StatusOK {
		tb.Errorf("/healthz while starting answers %d, want 200", code)
	}
	return out
}

func TestHTTPPathsServed(t *testing.T) {
	for path, code := range servedPaths(t) {
		if code != http.StatusOK {
			t.Errorf("GET %s answers %d, want 200", path, code)
		}
	}
}
