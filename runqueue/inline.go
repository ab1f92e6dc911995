package runqueue

import (
	"fmt"
	"regexp"
	"strings"
)

// Constant tables written into the code.
//
// Redis runs a script's whole body at every call, so a table of constants
// at the top of a fragment is built again at every call: the scheduler's
// SCHED table of 22 constants cost about 13,000 instructions of Redis CPU
// per call on Redis 7.0 (callgrind), and every function that reads it
// captures it as an upvalue. A fragment marks such a table with a line
// "--@inline" right above "local NAME = {"; the build drops the table and
// writes each NAME.KEY of the code as its value, so a script reads as the
// fragment does and costs what its literals cost. The table's values must
// be non-negative integer literals (a negative one would read as a comment
// after a minus) or single-quoted strings without escapes, and the
// code may use NAME only as NAME.KEY of a key it has, read as a value,
// after the table: anything else (NAME alone, an unknown key, an
// assignment, a method call, a use above the table, a long string or
// comment anywhere in the script) fails the build, so no script can run
// with a name the build left undefined. (The first target of a multiple
// assignment is not parsed: it makes a script Lua does not compile, which
// Redis refuses when New loads it.) The scanner does not follow scopes: a
// use after the block that holds the table, a nil global in the fragment,
// would read the value; the fragments define their tables at the top of a
// fragment, whose scope is the rest of the function that includes it. A
// table is defined once in a script (a second definition is an assignment
// to its name, refused).

// inlineDirective marks a table of constants to inline.
const inlineDirective = "--@inline"

var (
	inlineHead  = regexp.MustCompile(`^local ([A-Za-z_][A-Za-z0-9_]*) = \{`)
	inlineValue = regexp.MustCompile(`^([0-9]+|'[^'\\\n]*')$`)
	inlineKey   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// inlineConsts drops every table marked with inlineDirective from src and
// writes each use of its keys as the value (see above).
func inlineConsts(src string) (string, error) {
	for {
		at := directiveLine(src)
		if at < 0 {
			return src, nil
		}
		name, vals, rest, err := cutConstTable(src[at:])
		if err != nil {
			return "", err
		}
		if src, err = replaceConsts(src[:at]+rest, name, vals, at); err != nil {
			return "", err
		}
	}
}

// directiveLine is the offset of the first line that is the directive
// (indentation allowed), or -1.
func directiveLine(src string) int {
	for off := 0; off < len(src); {
		end := strings.IndexByte(src[off:], '\n')
		line := src[off:]
		if end >= 0 {
			line = src[off : off+end]
		}
		if strings.TrimSpace(line) == inlineDirective {
			return off
		}
		if end < 0 {
			break
		}
		off += end + 1
	}
	return -1
}

// cutConstTable reads the directive line and the table after it from the
// start of s: the table's name, its values by key, and s after the table's
// closing line.
func cutConstTable(s string) (name string, vals map[string]string, rest string, err error) {
	_, after, _ := strings.Cut(s, "\n")
	body := strings.TrimLeft(after, " \t")
	m := inlineHead.FindStringSubmatch(body)
	if m == nil {
		return "", nil, "", fmt.Errorf("runqueue: inline: %s is not followed by \"local NAME = {\"", inlineDirective)
	}
	name = m[1]
	open := len(after) - len(body) + len(m[0])
	// The table ends at the first "}" outside a quoted string.
	closeAt, quoted := -1, false
	for i := open; i < len(after); i++ {
		switch c := after[i]; {
		case c == '\'':
			quoted = !quoted
		case c == '\n' && quoted:
			return "", nil, "", fmt.Errorf("runqueue: inline: table %s: string runs past its line", name)
		case c == '}' && !quoted:
			closeAt = i
		}
		if closeAt >= 0 {
			break
		}
	}
	if closeAt < 0 {
		return "", nil, "", fmt.Errorf("runqueue: inline: table %s is not closed", name)
	}
	tail := after[closeAt+1:]
	line, rest, ok := strings.Cut(tail, "\n")
	if strings.TrimSpace(line) != "" {
		return "", nil, "", fmt.Errorf("runqueue: inline: table %s: code after its closing brace", name)
	}
	if !ok {
		rest = ""
	}
	vals = map[string]string{}
	for _, field := range splitFields(after[open:closeAt]) {
		k, v, ok := strings.Cut(field, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || !inlineKey.MatchString(k) || !inlineValue.MatchString(v) {
			return "", nil, "", fmt.Errorf("runqueue: inline: table %s: field %q is not KEY = integer or 'string'", name, strings.TrimSpace(field))
		}
		if _, dup := vals[k]; dup {
			return "", nil, "", fmt.Errorf("runqueue: inline: table %s: key %s twice", name, k)
		}
		vals[k] = v
	}
	return name, vals, rest, nil
}

// splitFields splits a table body at the commas outside quoted strings,
// dropping empty fields (a trailing comma).
func splitFields(body string) []string {
	var out []string
	start, quoted := 0, false
	for i := 0; i <= len(body); i++ {
		if i < len(body) && body[i] == '\'' {
			quoted = !quoted
		}
		if i == len(body) || (body[i] == ',' && !quoted) {
			if f := strings.TrimSpace(body[start:i]); f != "" {
				out = append(out, f)
			}
			start = i + 1
		}
	}
	return out
}

// replaceConsts writes each name.KEY of src's code (outside strings and
// comments) as vals[KEY], refusing any other use of name and any use
// before from, where the table was. A field of another table that has the
// same name (t.name) is not a use. Long strings and comments ([[...]],
// --[[...]]) are refused: the fragments have none, and this scanner does
// not follow them.
func replaceConsts(src, name string, vals map[string]string, from int) (string, error) {
	var b strings.Builder
	var quote byte
	for i := 0; i < len(src); i++ {
		c := src[i]
		switch {
		case quote != 0:
			if c == '\\' && i+1 < len(src) {
				b.WriteByte(c)
				i++
				c = src[i]
			} else if c == quote || c == '\n' {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '[' && i+1 < len(src) && (src[i+1] == '[' || src[i+1] == '='):
			return "", fmt.Errorf("runqueue: inline: a long string (%q) in a script that inlines %s", src[i:min(i+8, len(src))], name)
		case c == '-' && i+1 < len(src) && src[i+1] == '-':
			if strings.HasPrefix(src[i+2:], "[[") || strings.HasPrefix(src[i+2:], "[=") {
				return "", fmt.Errorf("runqueue: inline: a long comment in a script that inlines %s", name)
			}
			end := strings.IndexByte(src[i:], '\n')
			if end < 0 {
				end = len(src) - i
			}
			b.WriteString(src[i : i+end])
			i += end - 1
			continue
		case strings.HasPrefix(src[i:], name) && (i == 0 || !isIdent(src[i-1])) &&
			(i+len(name) == len(src) || !isIdent(src[i+len(name)])):
			if fieldOf(src, i) {
				b.WriteString(name) // t.name: another table's field
				i += len(name) - 1
				continue
			}
			if i < from {
				return "", fmt.Errorf("runqueue: inline: %s used before its definition", name)
			}
			j := i + len(name)
			if j >= len(src) || src[j] != '.' {
				return "", fmt.Errorf("runqueue: inline: %s used other than as %s.KEY", name, name)
			}
			k := j + 1
			for k < len(src) && isIdent(src[k]) {
				k++
			}
			key := src[j+1 : k]
			v, ok := vals[key]
			if !ok {
				return "", fmt.Errorf("runqueue: inline: %s.%s: no such key", name, key)
			}
			next := strings.TrimLeft(src[k:], " \t\r\n")
			concat := strings.HasPrefix(next, "..")
			if next != "" && !concat && (next[0] == ':' || next[0] == '(' || next[0] == '[' || next[0] == '.' ||
				next[0] == '=' && !strings.HasPrefix(next, "==")) {
				return "", fmt.Errorf("runqueue: inline: %s.%s is not read as a value", name, key)
			}
			b.WriteString(v)
			if concat && k < len(src) && src[k] == '.' {
				b.WriteByte(' ') // 1.. would read as a malformed number
			}
			i = k - 1
			continue
		}
		b.WriteByte(c)
	}
	return b.String(), nil
}

// fieldOf reports whether the name at src[i:] follows a "." (not "..") or
// a ":": a field or method of another value.
func fieldOf(src string, i int) bool {
	j := i - 1
	for j >= 0 && (src[j] == ' ' || src[j] == '\t') {
		j--
	}
	if j < 0 {
		return false
	}
	return src[j] == ':' || src[j] == '.' && (j == 0 || src[j-1] != '.')
}
