package config

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
)

// redacted replaces every secret this package prints.
const redacted = "REDACTED"

// SecretURL is a URL that may carry a password (postgres.url). Every way
// of printing it (String, fmt verbs, slog, JSON, YAML) redacts the
// password; Reveal returns the real value for the one place that connects
// with it.
type SecretURL string

// Reveal returns the URL with its password, to connect with. Never log it.
func (s SecretURL) Reveal() string { return string(s) }

// String returns the URL with its password redacted. Text that is not a
// well-formed URL with a host, where a password cannot be told apart from
// the rest, prints as REDACTED whole if it contains '@' or '='.
func (s SecretURL) String() string {
	raw := string(s)
	if u, err := url.Parse(raw); err == nil && u.Scheme != "" && u.Opaque == "" && u.Host != "" {
		return RedactURL(raw)
	}
	if strings.ContainsAny(raw, "@=") {
		return redacted
	}
	return raw
}

// GoString implements fmt.GoStringer (%#v), redacted.
func (s SecretURL) GoString() string { return fmt.Sprintf("config.SecretURL(%q)", s.String()) }

// LogValue implements slog.LogValuer, redacted.
func (s SecretURL) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalText implements encoding.TextMarshaler, redacted, so encoders
// (JSON, YAML) never write the password.
func (s SecretURL) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

var (
	// userinfoPassword matches scheme://user:password@ up to the last @ of
	// a run of non-space characters (a password may contain '@').
	userinfoPassword = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://[^:/?#@\s]*:)\S*@`)
	// userinfoToken matches scheme://token@, user information without a
	// password; tokenScheme decides whether it is a secret.
	userinfoToken = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*)://[^:/?#@\s]+@`)
	// paramPassword matches password=... in a query or a key=value DSN.
	paramPassword = regexp.MustCompile(`(?i)(\b(?:ssl)?password=)('[^']*'|[^&\s]*)`)
)

// tokenScheme reports whether the user information of a URL of scheme,
// when it has no password, is a credential of its own (an API token, as in
// https://TOKEN@registry): every scheme but PostgreSQL's, whose user alone
// is a role name and whose password comes from elsewhere.
func tokenScheme(scheme string) bool {
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		return false
	}
	return true
}

// RedactURL returns s with every password replaced by REDACTED: the
// password of a URL's user information, a token alone in the user
// information (https://TOKEN@host; not a postgres:// user, which is a role
// name), password= and sslpassword= query parameters, and the same inside
// free text such as an error message that quotes a connection string.
func RedactURL(s string) string {
	if u, err := url.Parse(s); err == nil && u.Host != "" {
		changed := false
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), redacted)
			changed = true
		} else if u.User.Username() != "" && tokenScheme(u.Scheme) {
			u.User = url.User(redacted)
			changed = true
		}
		if q := u.Query(); q.Has("password") || q.Has("sslpassword") {
			for _, name := range []string{"password", "sslpassword"} {
				if q.Has(name) {
					q.Set(name, redacted)
				}
			}
			u.RawQuery = q.Encode()
			changed = true
		}
		if changed {
			return u.String()
		}
	}
	s = userinfoPassword.ReplaceAllString(s, "${1}"+redacted+"@")
	s = userinfoToken.ReplaceAllStringFunc(s, func(m string) string {
		scheme, _, _ := strings.Cut(m, "://")
		if !tokenScheme(scheme) {
			return m
		}
		return scheme + "://" + redacted + "@"
	})
	return paramPassword.ReplaceAllString(s, "${1}"+redacted)
}

// Secret is a value that must never be printed (schema_registry.username
// and .password).
// Every way of printing it (String, fmt verbs, slog, JSON, YAML) gives
// REDACTED, or nothing when it is empty; Reveal returns the real value.
type Secret string

// Reveal returns the secret, to authenticate with. Never log it.
func (s Secret) Reveal() string { return string(s) }

// String returns REDACTED, or "" when the secret is empty.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString implements fmt.GoStringer (%#v), redacted.
func (s Secret) GoString() string { return fmt.Sprintf("config.Secret(%q)", s.String()) }

// LogValue implements slog.LogValuer, redacted.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalText implements encoding.TextMarshaler, redacted.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Properties are extra librdkafka properties (kafka.properties). Printing
// them (String, fmt verbs, slog, JSON, YAML) redacts every value whose name
// SensitiveProperty reports.
type Properties map[string]string

// String renders the properties in name order, sensitive values redacted.
func (p Properties) String() string {
	var b strings.Builder
	b.WriteString("map[")
	for i, k := range sortedKeys(p) {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(k + ":" + p.shown(k))
	}
	b.WriteString("]")
	return b.String()
}

// GoString implements fmt.GoStringer (%#v), redacted.
func (p Properties) GoString() string { return "config.Properties" + p.String() }

// LogValue implements slog.LogValuer: a group of the properties, redacted.
func (p Properties) LogValue() slog.Value {
	attrs := make([]slog.Attr, 0, len(p))
	for _, k := range sortedKeys(p) {
		attrs = append(attrs, slog.String(k, p.shown(k)))
	}
	return slog.GroupValue(attrs...)
}

// MarshalJSON writes the properties with sensitive values redacted.
func (p Properties) MarshalJSON() ([]byte, error) {
	return json.Marshal(p.redacted())
}

// MarshalYAML writes the properties with sensitive values redacted.
func (p Properties) MarshalYAML() (any, error) { return p.redacted(), nil }

func (p Properties) shown(k string) string {
	if SensitiveProperty(k) {
		return redacted
	}
	return p[k]
}

func (p Properties) redacted() map[string]string {
	out := make(map[string]string, len(p))
	for k := range p {
		out[k] = p.shown(k)
	}
	return out
}

// SensitiveProperty reports whether the librdkafka property name holds a
// secret. The name is split at '.', '_' and '-'; it is sensitive when a
// part contains password, passwd, secret, token, credential, private or
// jaas, or when a part is, or ends in, key (ssl.key.pem, ssl.key.password,
// ssl.key.location, sasl.oauthbearer.client.secret, an api.key). Parts
// such as keystore or keytab name files and are covered by their password
// properties.
func SensitiveProperty(name string) bool {
	parts := strings.FieldsFunc(strings.ToLower(name), func(r rune) bool {
		return r == '.' || r == '_' || r == '-'
	})
	for _, part := range parts {
		for _, w := range []string{"password", "passwd", "secret", "token", "credential", "private", "jaas"} {
			if strings.Contains(part, w) {
				return true
			}
		}
		if strings.HasSuffix(part, "key") {
			return true
		}
	}
	// The unsecured OAUTHBEARER configuration carries the principal and
	// its extensions.
	return strings.ToLower(name) == "sasl.oauthbearer.config"
}

// Redacted returns a copy of c that is safe to print or serialise: the
// passwords of postgres.url and schema_registry.url, the
// schema_registry credentials and every sensitive kafka.properties value
// are REDACTED. The copy shares no maps or slices with c. It is not a working
// configuration.
func (c Config) Redacted() Config {
	r := c
	r.Kafka.Brokers = append([]string(nil), c.Kafka.Brokers...)
	r.Kafka.Topics = append([]string(nil), c.Kafka.Topics...)
	r.Kafka.TopicFormats = maps.Clone(c.Kafka.TopicFormats)
	r.Kafka.Properties = c.Kafka.Properties.redacted()
	r.Postgres.URL = SecretURL(c.Postgres.URL.String())
	r.SchemaRegistry.URL = SecretURL(c.SchemaRegistry.URL.String())
	r.SchemaRegistry.Username = Secret(c.SchemaRegistry.Username.String())
	r.SchemaRegistry.Password = Secret(c.SchemaRegistry.Password.String())
	return r
}

// LogValue implements slog.LogValuer: one group per section, secrets
// redacted. With pipelines, a topic they read is decoded in their format,
// whatever kafka.format says: kafka.topic_formats shows it, kafka.format
// says so when pipelines read every topic, and a pipelines group names
// each pipeline's topic, format and table.
func (c Config) LogValue() slog.Value {
	piped := map[string]string{}
	for _, p := range c.Pipelines {
		piped[p.Topic] = p.Format + " (pipelines)"
	}
	var groups []slog.Attr
	var section string
	var attrs []slog.Attr
	flush := func() {
		if section != "" {
			groups = append(groups, slog.Attr{Key: section, Value: slog.GroupValue(attrs...)})
		}
		attrs = nil
	}
	for _, k := range keys {
		if s := k.section(); s != section {
			flush()
			section = s
		}
		name := strings.TrimPrefix(k.name, section+".")
		switch p := k.field(&c).(type) {
		case *[]string:
			attrs = append(attrs, slog.Any(name, append([]string(nil), *p...)))
		case *int:
			attrs = append(attrs, slog.Int(name, *p))
		case *Properties:
			attrs = append(attrs, slog.Any(name, *p))
		case *map[string]string:
			m := *p
			if k.name == "kafka.topic_formats" && len(piped) > 0 {
				m = maps.Clone(m)
				if m == nil {
					m = map[string]string{}
				}
				maps.Copy(m, piped)
			}
			pairs := make([]slog.Attr, 0, len(m))
			for _, k := range sortedKeys(m) {
				pairs = append(pairs, slog.String(k, m[k]))
			}
			attrs = append(attrs, slog.Attr{Key: name, Value: slog.GroupValue(pairs...)})
		case *time.Duration:
			attrs = append(attrs, slog.String(name, fmtDuration(*p)))
		default:
			v := show(p)
			if k.name == "kafka.format" && len(piped) > 0 && !slices.ContainsFunc(c.Kafka.Topics, func(t string) bool { return piped[t] == "" }) {
				v = "unused: pipelines decode every topic (kafka.topic_formats)"
			}
			attrs = append(attrs, slog.String(name, v))
		}
	}
	flush()
	if len(c.Pipelines) > 0 {
		pls := make([]slog.Attr, 0, len(c.Pipelines))
		for _, p := range c.Pipelines {
			into := ""
			if p.Upsert != nil {
				into = "upsert into " + p.Upsert.Table
			} else if p.Rollup != nil {
				into = "rollup into " + p.Rollup.Table
			} else if p.Append != nil {
				into = "append into " + p.Append.Table
			}
			pls = append(pls, slog.String(p.Name, p.Topic+" "+p.Format+" "+into))
		}
		groups = append(groups, slog.Attr{Key: "pipelines", Value: slog.GroupValue(pls...)})
	}
	return slog.GroupValue(groups...)
}

// String renders the configuration as key=value lines in reference order,
// secrets redacted.
func (c Config) String() string {
	lines := make([]string, len(keys))
	for i, k := range keys {
		lines[i] = k.name + "=" + show(k.field(&c))
	}
	return strings.Join(lines, "\n")
}

// GoString implements fmt.GoStringer (%#v), redacted.
func (c Config) GoString() string {
	return "config.Config{" + strings.ReplaceAll(c.String(), "\n", ", ") + "}"
}

// Format implements fmt.Formatter so that every verb (%v, %+v, %s, %#v,
// ...) prints the redacted form and none reaches the fields directly.
func (c Config) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('#') {
		_, _ = fmt.Fprint(f, c.GoString())
		return
	}
	_, _ = fmt.Fprint(f, c.String())
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
