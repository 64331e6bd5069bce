package config

import (
	"log/slog"
	"net/url"
	"regexp"
	"strings"
)

// SecretURL is a URL that may carry a password. Every way of printing it
// (String, %v, slog) shows the password as REDACTED; Reveal returns the
// real value for the one place that connects with it.
type SecretURL string

// Reveal returns the URL with its password, to connect with.
func (s SecretURL) Reveal() string { return string(s) }

// String returns the URL with the password redacted.
func (s SecretURL) String() string { return RedactURL(string(s)) }

// GoString implements fmt.GoStringer, redacted.
func (s SecretURL) GoString() string { return `config.SecretURL("` + s.String() + `")` }

// LogValue implements slog.LogValuer, redacted.
func (s SecretURL) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalText keeps encoders from writing the password.
func (s SecretURL) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

var (
	urlPassword = regexp.MustCompile(`(://[^:/?#@\s]*:)[^@\s]*@`)
	kvPassword  = regexp.MustCompile(`(?i)(password=)[^&\s]*`)
)

// RedactURL replaces the passwords in s, a URL or any text containing URLs
// or password= parameters, with REDACTED.
func RedactURL(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "REDACTED")
			s = u.String()
		}
	}
	s = urlPassword.ReplaceAllString(s, "${1}REDACTED@")
	return kvPassword.ReplaceAllString(s, "${1}REDACTED")
}

// Properties are extra librdkafka properties. Printing them redacts every
// sensitive value (see SensitiveProperty).
type Properties map[string]string

// String renders the properties with sensitive values redacted.
func (p Properties) String() string {
	var b strings.Builder
	b.WriteString("{")
	first := true
	for _, k := range sortedKeys(p) {
		if !first {
			b.WriteString(" ")
		}
		first = false
		v := p[k]
		if SensitiveProperty(k) {
			v = "REDACTED"
		}
		b.WriteString(k + ":" + v)
	}
	b.WriteString("}")
	return b.String()
}

// LogValue implements slog.LogValuer, redacted.
func (p Properties) LogValue() slog.Value { return slog.StringValue(p.String()) }

// SensitiveProperty reports whether a librdkafka property holds a secret:
// passwords, private keys, client secrets, tokens, JAAS configuration.
func SensitiveProperty(name string) bool {
	n := strings.ToLower(name)
	for _, w := range []string{"password", "secret", "token", "jaas", "private", ".key.pem", "ssl.key", "sasl.oauthbearer.config"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && keys[j] < keys[j-1]; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	return keys
}
