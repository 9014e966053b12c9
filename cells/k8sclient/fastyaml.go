package k8sclient

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

// fastYAMLToJSON converts the YAML that manifests are almost always written
// in (block mappings and sequences, one-line flow collections, plain and
// simply quoted scalars, comments) to JSON, the same JSON as
// sigsyaml.YAMLToJSONStrict gives, several times faster: parsing YAML was
// half of the time a large manifests directory took to load. For anything
// else (anchors, tags, block scalars, escapes, multi-line scalars and
// flow collections, duplicate keys, scalars whose YAML 1.1 type is not
// plainly a string, a decimal integer or true/false) it returns false, and
// the caller uses the reference converter, which also gives the errors.
// FuzzFastYAMLToJSON holds it to the reference.
func fastYAMLToJSON(doc []byte) ([]byte, bool) {
	js, _, ok := fastYAMLConvert(doc)
	return js, ok
}

// typeHeader is a document's apiVersion and kind, when the fast converter
// read both as top-level keys spelt exactly so, with plain words as values
// (which JSON holds as the same strings).
type typeHeader struct {
	apiVersion, kind string
}

// fastYAMLConvert is fastYAMLToJSON, and the document's typeHeader when it
// has one (empty fields otherwise).
func fastYAMLConvert(doc []byte) ([]byte, typeHeader, bool) {
	var h typeHeader
	if !printable(doc) {
		return nil, h, false
	}
	p := &yamlParser{lines: make([]yamlLine, 0, bytes.Count(doc, []byte("\n"))+1)}
	// One string for the document: the lines' texts share it.
	for line := range strings.Lines(string(doc)) {
		text := strings.TrimRight(line, "\r\n")
		indent := len(text) - len(strings.TrimLeft(text, " "))
		content := stripComment(text[indent:])
		if content == "" {
			continue
		}
		if strings.ContainsAny(text[:indent], "\t") || strings.HasPrefix(content, "\t") {
			return nil, h, false
		}
		p.lines = append(p.lines, yamlLine{indent: indent, text: content})
	}
	if len(p.lines) == 0 || p.lines[0].indent != 0 {
		return nil, h, false
	}
	var out bytes.Buffer
	out.Grow(len(doc))
	if !p.block(&out, 0) || p.pos != len(p.lines) || p.failed {
		return nil, h, false
	}
	for _, l := range p.lines {
		if l.indent != 0 {
			continue
		}
		key, value, ok := splitKey(l.text)
		if !ok || !isPlainKey(value) || !isPlainString(value) {
			continue
		}
		switch key {
		case "apiVersion":
			h.apiVersion = value
		case "kind":
			h.kind = value
		}
	}
	return out.Bytes(), h, true
}

// printable says whether doc is UTF-8 of the characters YAML allows in a
// stream, without a byte order mark, whose only line breaks are \n and
// \r\n (YAML also breaks lines at a lone \r, NEL, LS and PS).
func printable(doc []byte) bool {
	for i := 0; i < len(doc); {
		if c := doc[i]; c >= 0x20 && c < 0x7f {
			i++ // printable ASCII, most of a manifest
			continue
		}
		r, size := utf8.DecodeRune(doc[i:])
		switch {
		case r == '\n' || r == '\t':
		case r == '\r':
			if i+1 >= len(doc) || doc[i+1] != '\n' {
				return false
			}
		case r == utf8.RuneError && size <= 1:
			return false
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == 0x2028 || r == 0x2029 ||
			r == 0xfeff || r == 0xfffe || r == 0xffff:
			return false
		}
		i += size
	}
	return true
}

type yamlLine struct {
	indent int
	text   string
}

type yamlParser struct {
	lines  []yamlLine
	pos    int
	failed bool
}

// stripComment removes a comment: a # at the start or after a space, not
// inside quotes. A quote that does not close makes the line unparseable
// here, which the caller finds out.
func stripComment(s string) string {
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == '#' && (i == 0 || s[i-1] == ' '):
			return strings.TrimRight(s[:i], " ")
		}
	}
	return strings.TrimRight(s, " ")
}

// block parses the mapping or sequence starting at the current line, whose
// lines are indented by indent.
func (p *yamlParser) block(out *bytes.Buffer, indent int) bool {
	if p.pos >= len(p.lines) || p.lines[p.pos].indent != indent {
		return false
	}
	if isSeqItem(p.lines[p.pos].text) {
		return p.sequence(out, indent)
	}
	return p.mapping(out, indent, "")
}

func isSeqItem(s string) bool { return s == "-" || strings.HasPrefix(s, "- ") }

// mapping parses the keys at indent; first, when set, is the text of its
// first key line, found after a sequence item's "- ".
func (p *yamlParser) mapping(out *bytes.Buffer, indent int, first string) bool {
	out.WriteByte('{')
	seen := map[string]bool{}
	for n := 0; ; n++ {
		var text string
		switch {
		case n == 0 && first != "":
			text = first
		case p.pos < len(p.lines) && p.lines[p.pos].indent == indent && !isSeqItem(p.lines[p.pos].text):
			text = p.lines[p.pos].text
			p.pos++
		default:
			if p.pos < len(p.lines) && p.lines[p.pos].indent > indent {
				return false // a line that belongs nowhere
			}
			out.WriteByte('}')
			return true
		}
		key, value, ok := splitKey(text)
		if !ok || seen[key] {
			return false
		}
		seen[key] = true
		if n > 0 {
			out.WriteByte(',')
		}
		appendJSONString(out, key)
		out.WriteByte(':')
		if value != "" {
			if !p.inline(out, value) {
				return false
			}
			continue
		}
		// The value is on the next lines: deeper, or a sequence at the
		// same indentation; none is null.
		switch {
		case p.pos < len(p.lines) && p.lines[p.pos].indent > indent:
			if !p.block(out, p.lines[p.pos].indent) {
				return false
			}
		case p.pos < len(p.lines) && p.lines[p.pos].indent == indent && isSeqItem(p.lines[p.pos].text):
			if !p.sequence(out, indent) {
				return false
			}
		default:
			out.WriteString("null")
		}
	}
}

func (p *yamlParser) sequence(out *bytes.Buffer, indent int) bool {
	out.WriteByte('[')
	for n := 0; p.pos < len(p.lines) && p.lines[p.pos].indent == indent && isSeqItem(p.lines[p.pos].text); n++ {
		item := strings.TrimLeft(strings.TrimPrefix(p.lines[p.pos].text, "-"), " ")
		itemIndent := indent + len(p.lines[p.pos].text) - len(item)
		p.pos++
		if n > 0 {
			out.WriteByte(',')
		}
		switch {
		case item == "":
			if p.pos < len(p.lines) && p.lines[p.pos].indent > indent {
				if !p.block(out, p.lines[p.pos].indent) {
					return false
				}
			} else {
				out.WriteString("null")
			}
		case isSeqItem(item):
			return false // "- - x": nested on one line
		default:
			if _, _, isKey := splitKey(item); isKey && item[0] != '{' && item[0] != '[' {
				if !p.mapping(out, itemIndent, item) {
					return false
				}
			} else if !p.inline(out, item) {
				return false
			}
		}
	}
	if p.pos < len(p.lines) && p.lines[p.pos].indent > indent {
		return false
	}
	out.WriteByte(']')
	return true
}

// maxKey is below YAML's limit of 1024 characters for a key on one line
// with its quotes.
const maxKey = 1000

// splitKey splits "key: value" or "key:"; the key must be a plain word or
// a simply quoted string that YAML reads as a string.
func splitKey(s string) (key, value string, ok bool) {
	var rest string
	defer func() {
		if len(key) > maxKey {
			key, value, ok = "", "", false
		}
	}()
	if s != "" && (s[0] == '"' || s[0] == '\'') {
		k, r, ok := quoted(s)
		if !ok {
			return "", "", false
		}
		key, rest = k, r
	} else {
		i := strings.Index(s, ":")
		if i <= 0 {
			return "", "", false
		}
		key, rest = s[:i], s[i:]
		if !isPlainKey(key) || !isPlainString(key) {
			return "", "", false
		}
	}
	switch {
	case rest == ":":
		return key, "", true
	case strings.HasPrefix(rest, ": "):
		return key, strings.TrimLeft(rest[2:], " "), true
	}
	return "", "", false
}

// isPlainKey says whether s is a key of letters, digits and _./- that does
// not start with one of ./- (the regular expression
// ^[A-Za-z0-9_][A-Za-z0-9_./-]*$, without its cost: a tenth of the decode).
func isPlainKey(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_':
		case (c == '.' || c == '/' || c == '-') && i > 0:
		default:
			return false
		}
	}
	return true
}

// inline writes a value on one line: a flow collection or a scalar.
func (p *yamlParser) inline(out *bytes.Buffer, s string) bool {
	f := flow{s: s}
	if !f.value(out, false) {
		return false
	}
	f.skipSpace()
	return f.i == len(f.s)
}

// flow parses one line of flow YAML.
type flow struct {
	s string
	i int
}

func (f *flow) skipSpace() {
	for f.i < len(f.s) && f.s[f.i] == ' ' {
		f.i++
	}
}

// value parses a flow collection, a quoted scalar, or a plain scalar; in a
// collection, a plain scalar ends at , ] or }.
func (f *flow) value(out *bytes.Buffer, inCollection bool) bool {
	f.skipSpace()
	if f.i >= len(f.s) {
		return false
	}
	switch f.s[f.i] {
	case '{':
		return f.mapping(out)
	case '[':
		return f.sequence(out)
	case '"', '\'':
		v, rest, ok := quoted(f.s[f.i:])
		if !ok {
			return false
		}
		f.i = len(f.s) - len(rest)
		appendJSONString(out, v)
		return true
	}
	end := len(f.s)
	if inCollection {
		if j := strings.IndexAny(f.s[f.i:], ",]}"); j >= 0 {
			end = f.i + j
		}
	}
	plain := strings.TrimRight(f.s[f.i:end], " ")
	f.i = end
	if inCollection && strings.ContainsAny(plain, "[{?") {
		// Flow indicators end a plain scalar in a collection.
		return false
	}
	return appendPlain(out, plain)
}

func (f *flow) mapping(out *bytes.Buffer) bool {
	f.i++ // {
	out.WriteByte('{')
	seen := map[string]bool{}
	for n := 0; ; n++ {
		f.skipSpace()
		if f.i < len(f.s) && f.s[f.i] == '}' && n == 0 {
			f.i++
			out.WriteByte('}')
			return true
		}
		var key string
		if f.i < len(f.s) && (f.s[f.i] == '"' || f.s[f.i] == '\'') {
			k, rest, ok := quoted(f.s[f.i:])
			if !ok {
				return false
			}
			key, f.i = k, len(f.s)-len(rest)
		} else {
			j := strings.Index(f.s[f.i:], ":")
			if j <= 0 {
				return false
			}
			key = f.s[f.i : f.i+j]
			if !isPlainKey(key) || !isPlainString(key) {
				return false
			}
			f.i += j
		}
		if !strings.HasPrefix(f.s[f.i:], ": ") || seen[key] || len(key) > maxKey {
			return false
		}
		seen[key] = true
		f.i += 2
		if n > 0 {
			out.WriteByte(',')
		}
		appendJSONString(out, key)
		out.WriteByte(':')
		if !f.value(out, true) {
			return false
		}
		f.skipSpace()
		if f.i >= len(f.s) {
			return false
		}
		switch f.s[f.i] {
		case ',':
			f.i++
		case '}':
			f.i++
			out.WriteByte('}')
			return true
		default:
			return false
		}
	}
}

func (f *flow) sequence(out *bytes.Buffer) bool {
	f.i++ // [
	out.WriteByte('[')
	for n := 0; ; n++ {
		f.skipSpace()
		if f.i < len(f.s) && f.s[f.i] == ']' && n == 0 {
			f.i++
			out.WriteByte(']')
			return true
		}
		if n > 0 {
			out.WriteByte(',')
		}
		if !f.value(out, true) {
			return false
		}
		f.skipSpace()
		if f.i >= len(f.s) {
			return false
		}
		switch f.s[f.i] {
		case ',':
			f.i++
		case ']':
			f.i++
			out.WriteByte(']')
			return true
		default:
			return false
		}
	}
}

// quoted reads a quoted scalar at the start of s: double-quoted without
// escapes, or single-quoted, where two single quotes stand for one. It
// returns the rest of s.
func quoted(s string) (value, rest string, ok bool) {
	q := s[0]
	if q == '"' {
		j := strings.IndexByte(s[1:], '"')
		if j < 0 || strings.ContainsRune(s[1:1+j], '\\') {
			return "", "", false
		}
		return s[1 : 1+j], s[2+j:], true
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		if s[i] != '\'' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '\'' {
			b.WriteByte('\'')
			i++
			continue
		}
		return b.String(), s[i+1:], true
	}
	return "", "", false
}

// indicators may not start a plain scalar, or start one that this parser
// leaves to the reference.
const indicators = "-?:,[]{}#&*!|>'\"%@`"

// appendPlain writes a plain scalar as YAML 1.1 (which kubectl and the
// reference converter follow) types it, when that is plainly a string, a
// decimal integer, true or false.
func appendPlain(out *bytes.Buffer, s string) bool {
	if s == "" || strings.ContainsAny(s[:1], indicators) || strings.Contains(s, ": ") || strings.Contains(s, " #") ||
		strings.HasSuffix(s, ":") || strings.ContainsAny(s, "\t") {
		return false
	}
	switch s {
	case "true", "false":
		out.WriteString(s)
		return true
	}
	if isDecimal(s) {
		out.WriteString(s)
		return true
	}
	if !isPlainString(s) {
		return false
	}
	appendJSONString(out, s)
	return true
}

// isDecimal is a decimal integer without leading zeros that fits in 64 bits.
func isDecimal(s string) bool {
	digits := strings.TrimPrefix(s, "-")
	if digits == "" || len(digits) > 18 || (digits[0] == '0' && len(digits) > 1) {
		return false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return false
		}
	}
	return true
}

var yamlFloatRE = regexp.MustCompile(`^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`)

// isPlainString says whether YAML 1.1 reads the plain scalar s as a
// string: it is none of the words for null, booleans, infinity and NaN, no
// number in any base or notation, and no timestamp.
func isPlainString(s string) bool {
	if len(s) <= len("false") { // the longest of the words below
		switch strings.ToLower(s) {
		case "", "~", "null", "y", "yes", "n", "no", "on", "off", "true", "false",
			".nan", ".inf", "+.inf", "-.inf", "<<":
			return false
		}
	}
	c := s[0]
	if dottedDigits(s) {
		// An IPv4 address or a version: no YAML number has two dots. The
		// checks below cost a regular expression and three failed parses
		// (each an error allocated), for every address of a manifest.
		return true
	}
	if c == '.' || c == '+' || c == '-' || (c >= '0' && c <= '9') {
		if yamlFloatRE.MatchString(s) {
			return false
		}
		plain := strings.ReplaceAll(s, "_", "")
		if _, err := strconv.ParseInt(plain, 0, 64); err == nil {
			return false
		}
		if _, err := strconv.ParseUint(plain, 0, 64); err == nil {
			return false
		}
		if _, err := strconv.ParseFloat(plain, 64); err == nil {
			return false
		}
		// A date or a time: left to the reference.
		if strings.ContainsAny(s, "-:") {
			return false
		}
	}
	return true
}

// appendJSONString writes s as a JSON string.
func appendJSONString(out *bytes.Buffer, s string) {
	out.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			out.WriteByte('\\')
			out.WriteByte(c)
		case c < 0x20:
			out.WriteString(`\u00`)
			out.WriteByte("0123456789abcdef"[c>>4])
			out.WriteByte("0123456789abcdef"[c&0xf])
		default:
			out.WriteByte(c)
		}
	}
	out.WriteByte('"')
}

// dottedDigits says whether s is digits and at least two dots, such as
// "10.96.0.1".
func dottedDigits(s string) bool {
	dots := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '.':
			dots++
		case c < '0' || c > '9':
			return false
		}
	}
	return dots >= 2
}
