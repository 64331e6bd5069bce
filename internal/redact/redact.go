// Package redact takes record values out of error text before it reaches
// a log line, a metric or the page.
//
// A dead letter's reason quotes the record's own values: `"soon" is not an
// RFC 3339 time`, `the int 1796378577036 is not a timestamp`, PostgreSQL's
// `invalid input syntax for type numeric: "…"`. An email address or a card
// number in a bad field would go with them to every place the reason is
// shown. The dead letter itself keeps the full text (its ratchet.error
// header, next to the record, which holds the value anyway);
// everywhere else the text goes through Values unless the user opted in
// (log.include_values).
package redact

import "regexp"

// Elided replaces a value.
const Elided = "…"

var (
	// A double-quoted string, unless it follows a word that makes it an
	// identifier in PostgreSQL's messages (relation "orders", constraint
	// "orders_pkey", column "amount", type "mood"). Go regexp has no
	// look-behind: the identifier word is captured and written back.
	quoted = regexp.MustCompile(`((?:relation|constraint|column|table|index|schema|type|function|sequence|database|role|enum) )?"(?:[^"\\]|\\.)*"`)
	// A CEL value as the pipelines render it: "the int 1796378577036".
	celValue = regexp.MustCompile(`\bthe (int|uint|double|string|bool|bytes|timestamp|duration|map|list) (?:"(?:[^"\\]|\\.)*"|\S+?)(\.\.\.)?( is | for |$|[,;:)])`)
	// A bare number a message starts with, or one after ": ": "1e400 is
	// not a finite number", "99999999999999999 epoch milliseconds".
	bareNumber = regexp.MustCompile(`(^|: )[-+]?(?:\d[\d_]*(?:\.\d*)?(?:[eE][-+]?\d+)?|NaN|Inf|\+Inf|-Inf)( is | epoch )`)
	// PostgreSQL's DETAIL of a key: Key (order_id)=(4111 1111 1111 1111).
	keyDetail = regexp.MustCompile(`\)=\((?:[^()]|\([^()]*\))*\)`)
)

// Values returns text with the values of records replaced by Elided:
// quoted strings that are not PostgreSQL identifiers, CEL values as the
// pipelines render them, bare numbers a clause starts with, and the values
// of a key's DETAIL. Key paths, column and constraint names, type names,
// offsets and SQLSTATEs stay.
func Values(text string) string {
	text = quoted.ReplaceAllStringFunc(text, func(m string) string {
		sub := quoted.FindStringSubmatch(m)
		if sub[1] != "" {
			return m
		}
		return `"` + Elided + `"`
	})
	text = celValue.ReplaceAllString(text, "the $1 "+Elided+"$3")
	text = bareNumber.ReplaceAllString(text, "$1"+Elided+"$2")
	return keyDetail.ReplaceAllString(text, ")=("+Elided+")")
}

var (
	batchAddress  = regexp.MustCompile(`\bapply \S+\[\d+\] offsets \d+\.\.\d+: `)
	recordAddress = regexp.MustCompile(`\brecord \S+\[\d+\]@\d+: `)
)

// Addresses returns text without the addresses the engine and the
// pipelines put in a record's error ("apply events[3] offsets 120..121: ",
// "record orders[2]@1031: "), which differ for every record: what is left
// is the same for every record refused for the same cause, and can be
// grouped by.
func Addresses(text string) string {
	return recordAddress.ReplaceAllString(batchAddress.ReplaceAllString(text, ""), "")
}
