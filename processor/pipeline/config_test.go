package pipeline_test

import (
	"strings"
	"testing"

	"ratchet/config"
	"ratchet/processor/pipeline"
)

// TestConfigurationErrors: every configuration error of a pipeline is a
// *config.Error (exit code 2) with a line naming its key path, found by
// Load (shape, names, topics, formats, sinks) or Compile (expressions).
func TestConfigurationErrors(t *testing.T) {
	const head = "kafka:\n  topics: [orders]\npipelines:\n"
	const upsert = "    upsert: {table: orders, key: {id: string(record.key)}, columns: {amount: double(value.amount)}}\n"
	const rollup = "    rollup: {table: r, time: value.ts, bucket: 1m, bucket_column: minute, group_by: {c: value.c}, aggregates: {n: count}}\n"
	cases := []struct {
		name, yaml, want string
	}{
		{"CEL that does not compile", head + "  - name: a\n    topic: orders\n    format: json\n" +
			"    upsert: {table: t, key: {id: string(record.key)}, columns: {amount: 'value.amount +'}}\n",
			"pipelines[0].upsert.columns.amount: CEL does not compile"},
		{"unknown format", head + "  - name: a\n    topic: orders\n    format: xml\n" + upsert,
			`pipelines[0].format: "xml" is not allowed (allowed: json, avro, protobuf or event)`},
		{"avro without a registry", head + "  - name: a\n    topic: orders\n    format: avro\n" + upsert,
			`pipelines[0].format: "avro" is not allowed`},
		{"no sink", head + "  - name: a\n    topic: orders\n    format: json\n", "pipelines[0]: no sink"},
		{"two sinks", head + "  - name: a\n    topic: orders\n    format: json\n" + upsert + rollup, "pipelines[0]: two sinks"},
		{"duplicate names", head + "  - name: a\n    topic: orders\n    format: json\n" + upsert + "  - name: a\n    topic: orders\n    format: json\n" + upsert,
			`pipelines[1].name: "a" is not allowed (allowed: a unique name (pipelines[0] has it too))`},
		{"bad name", head + "  - name: Orders\n    topic: orders\n    format: json\n" + upsert, `pipelines[0].name: "Orders" is not allowed`},
		{"topic not consumed", head + "  - name: a\n    topic: payments\n    format: json\n" + upsert, `pipelines[0].topic: "payments" is not allowed`},
		{"topic read by no pipeline", "kafka:\n  topics: [orders, payments]\npipelines:\n  - name: a\n    topic: orders\n    format: json\n" + upsert,
			"kafka.topics: topic payments is read by no pipeline"},
		{"two formats on one topic", head + "  - name: a\n    topic: orders\n    format: json\n" + upsert + "  - name: b\n    topic: orders\n    format: event\n" + rollup,
			`pipelines[1].format: "event" is not allowed (allowed: json, as the other pipelines of topic orders`},
		{"unknown key", head + "  - name: a\n    topic: orders\n    format: json\n    wher: x\n" + upsert, "pipelines[0].wher: unknown key (did you mean where?)"},
		{"unknown sink key", head + "  - name: a\n    topic: orders\n    format: json\n" +
			"    upsert: {table: t, keys: {id: string(record.key)}}\n", "pipelines[0].upsert.keys: unknown key (did you mean key?)"},
		{"upsert without key", head + "  - name: a\n    topic: orders\n    format: json\n" + "    upsert: {table: t, columns: {a: value.a}}\n",
			`pipelines[0].upsert.key: "" is not allowed`},
		{"bad on_tombstone", head + "  - name: a\n    topic: orders\n    format: json\n" +
			"    upsert: {table: t, key: {id: string(record.key)}, on_tombstone: drop}\n", `pipelines[0].upsert.on_tombstone: "drop" is not allowed (allowed: delete or ignore)`},
		{"tombstone delete with a key that reads value", head + "  - name: a\n    topic: orders\n    format: json\n" +
			"    upsert: {table: t, key: {id: value.id}, on_tombstone: delete}\n", `pipelines[0].upsert.key.id: "value.id" is not allowed`},
		{"bad table name", head + "  - name: a\n    topic: orders\n    format: json\n" +
			"    upsert: {table: 'orders; drop table x', key: {id: string(record.key)}}\n", `pipelines[0].upsert.table: "orders; drop table x" is not allowed`},
		{"bucket too small", head + "  - name: a\n    topic: orders\n    format: json\n" + strings.Replace(rollup, "bucket: 1m", "bucket: 500ms", 1),
			`pipelines[0].rollup.bucket: "500ms" is not allowed`},
		{"bucket not a duration", head + "  - name: a\n    topic: orders\n    format: json\n" + strings.Replace(rollup, "bucket: 1m", "bucket: often", 1),
			`pipelines[0].rollup.bucket: "often" is not allowed`},
		{"bad aggregate", head + "  - name: a\n    topic: orders\n    format: json\n" + strings.Replace(rollup, "n: count", "revenue: avg(value.x)", 1),
			`pipelines[0].rollup.aggregates.revenue: "avg(value.x)" is not allowed (allowed: count, sum(E), min(E) or max(E)`},
		{"two aggregates in one", head + "  - name: a\n    topic: orders\n    format: json\n" + strings.Replace(rollup, "n: count", "n: 'sum(value.a) + sum(value.b)'", 1),
			`pipelines[0].rollup.aggregates.n: "sum(value.a) + sum(value.b)" is not allowed`},
		{"sum of a string", head + "  - name: a\n    topic: orders\n    format: json\n" + strings.Replace(rollup, "n: count", "n: sum(string(value.a))", 1),
			`pipelines[0].rollup.aggregates.n: "sum(string(value.a))" is not allowed (allowed: sum of a number`},
		{"errors ratio above 1", head + "  - name: a\n    topic: orders\n    format: json\n    errors: {max_ratio: 1.5}\n" + upsert,
			`pipelines[0].errors.max_ratio: "1.5" is not allowed (allowed: a ratio above 0 and at most 1 (1: never stop))`},
		{"errors window not a number", head + "  - name: a\n    topic: orders\n    format: json\n    errors: {window: lots}\n" + upsert,
			`pipelines[0].errors.window: "lots" is not allowed`},
		{"errors min_failures above the window", head + "  - name: a\n    topic: orders\n    format: json\n    errors: {min_failures: 50, window: 10}\n" + upsert,
			`pipelines[0].errors.min_failures: "50" is not allowed (allowed: at most the window (10)`},
		{"errors unknown key", head + "  - name: a\n    topic: orders\n    format: json\n    errors: {tolerance: all}\n" + upsert,
			`pipelines[0].errors.tolerance: unknown key`},
		{"where not a bool", head + "  - name: a\n    topic: orders\n    format: json\n    where: '1 + 2'\n" + upsert,
			`pipelines[0].where: "1 + 2" is not allowed (allowed: a CEL expression that yields a bool`},
		{"time not a time", head + "  - name: a\n    topic: orders\n    format: json\n" + strings.Replace(rollup, "time: value.ts", "time: 'true'", 1),
			`pipelines[0].rollup.time: "true" is not allowed`},
		{"column written twice", head + "  - name: a\n    topic: orders\n    format: json\n" +
			"    upsert: {table: t, key: {id: string(record.key)}, columns: {ID: value.id}}\n",
			"pipelines[0].upsert.columns.ID: column id is written twice: pipelines[0].upsert.key.id writes it too (column names are case-insensitive)"},
		{"bucket column written twice", head + "  - name: a\n    topic: orders\n    format: json\n" + strings.Replace(rollup, "group_by: {c: value.c}", "group_by: {Minute: value.c}", 1),
			"pipelines[0].rollup.group_by.Minute: column minute is written twice: pipelines[0].rollup.bucket_column writes it too"},
		{"aggregate not closed", head + "  - name: a\n    topic: orders\n    format: json\n" + strings.Replace(rollup, "n: count", "n: 'sum(double(value.a)'", 1),
			"pipelines[0].rollup.aggregates.n: unbalanced parentheses: the ( at column 4 is not closed"},
		{"aggregate closed twice", head + "  - name: a\n    topic: orders\n    format: json\n" + strings.Replace(rollup, "n: count", "n: 'max(value.a))'", 1),
			"pipelines[0].rollup.aggregates.n: unbalanced parentheses: the ) at column 13 closes nothing"},
		{"parenthesis in a string", head + "  - name: a\n    topic: orders\n    format: json\n" + strings.Replace(rollup, "n: count", `n: 'sum(value.a) + size(")")'`, 1),
			`pipelines[0].rollup.aggregates.n: "sum(value.a) + size(\")\")" is not allowed (allowed: count, sum(E)`},
		{"CEL over the cost limit on any record", head + "  - name: a\n    topic: orders\n    format: json\n    cost_limit: 100\n" +
			"    where: '[1,2,3,4,5,6,7,8,9,10].map(x, x * 2).size() > 0'\n" + upsert,
			"pipelines[0].where: CEL costs at least 163 on any record, over the pipeline's cost_limit 100"},
		{"cost_limit zero", head + "  - name: a\n    topic: orders\n    format: json\n    cost_limit: 0\n" + upsert,
			`pipelines[0].cost_limit: "0" is not allowed (allowed: a whole number above 0 (default 1000000))`},
		{"cost_limit not a number", head + "  - name: a\n    topic: orders\n    format: json\n    cost_limit: lots\n" + upsert,
			`pipelines[0].cost_limit: "lots" is not allowed`},
		{"epoch_millis_window zero", head + "  - name: a\n    topic: orders\n    format: json\n    epoch_millis_window: {past: 0s}\n" + rollup,
			`pipelines[0].epoch_millis_window.past: "0s" is not allowed (allowed: a duration above 0, such as 7305d or 36h)`},
		{"epoch_millis_window not a duration", head + "  - name: a\n    topic: orders\n    format: json\n    epoch_millis_window: {future: soon}\n" + rollup,
			`pipelines[0].epoch_millis_window.future: "soon" is not allowed`},
		{"epoch_millis_window unknown key", head + "  - name: a\n    topic: orders\n    format: json\n    epoch_millis_window: {pasts: 1d}\n" + rollup,
			`pipelines[0].epoch_millis_window.pasts: unknown key (did you mean past?)`},
		{"epoch_millis_window not a mapping", head + "  - name: a\n    topic: orders\n    format: json\n    epoch_millis_window: 1d\n" + rollup,
			`pipelines[0].epoch_millis_window: "1d" is not allowed (allowed: a mapping with past and future`},
		{"not a list", "kafka:\n  topics: [orders]\npipelines: {name: a}\n", `pipelines: "{name: a}" is not allowed (allowed: a list of pipelines`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := loadConfig(t, tc.yaml)
			if err == nil {
				_, err = pipeline.Compile(cfg)
			}
			if !config.IsConfigError(err) {
				t.Fatalf("err = %v, want a configuration error", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err =\n%s\nwant a line containing\n%s", err, tc.want)
			}
		})
	}
}

// The example and a minimal pipeline compile without problems.
func TestValidConfigurationsCompile(t *testing.T) {
	cfg, err := loadConfig(t, ordersYAML)
	if err != nil {
		t.Fatal(err)
	}
	set, err := pipeline.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(set.Names(), ","); got != "orders,revenue_per_minute" {
		t.Fatalf("names = %s", got)
	}
}

// pipelines[].errors is read into the pipeline's failure guard limits;
// fields left out take the defaults.
func TestPipelineErrorsLoad(t *testing.T) {
	const yaml = "kafka:\n  topics: [orders]\npipelines:\n  - name: a\n    topic: orders\n    format: json\n" +
		"    errors: {max_ratio: 1, window: 200}\n" +
		"    upsert: {table: orders, key: {id: string(record.key)}}\n"
	cfg, err := loadConfig(t, yaml)
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.Pipelines[0].Errors.Limits()
	want := config.PipelineErrors{MaxRatio: 1, MinFailures: config.DefaultPipelineMinFailures, Window: 200}
	if got != want {
		t.Fatalf("limits = %+v, want %+v", got, want)
	}
}
