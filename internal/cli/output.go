package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"
)

// output is where a command writes its result: a table (or a list of
// fields) for people, or one JSON document.
type output struct {
	w     io.Writer
	json  bool
	vtime bool // -vtime: the deployment runs the fair scheduler
}

func (o *output) writeJSON(v any) error {
	enc := json.NewEncoder(o.w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// table writes tab-separated cells aligned in columns.
type table struct{ tw *tabwriter.Writer }

func (o *output) table() *table {
	return &table{tw: tabwriter.NewWriter(o.w, 0, 0, 2, ' ', 0)}
}

func (t *table) row(cells ...string) {
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() error { return t.tw.Flush() }

// fields writes "name  value" lines, aligned.
func (o *output) fields(pairs ...string) error {
	t := o.table()
	for i := 0; i+1 < len(pairs); i += 2 {
		t.row(pairs[i], pairs[i+1])
	}
	return t.flush()
}

// name renders a user string in a table: "" (no concurrency key) as "-",
// and a name that would be mistaken for that, or that has spaces at its
// ends, quoted. JSON has the exact strings.
func name(s string) string {
	switch {
	case s == "":
		return "-"
	case s == "-" || strings.TrimSpace(s) != s || strings.HasPrefix(s, `"`):
		return strconv.Quote(s)
	}
	return s
}

// num renders a float with at most three decimals and no trailing zeros.
func num(f float64) string {
	s := strconv.FormatFloat(f, 'f', 3, 64)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	if s == "-0" {
		s = "0"
	}
	return s
}

// weight renders a weight exactly as it was set.
func weight(w float64) string { return strconv.FormatFloat(w, 'g', -1, 64) }

func count(n int64) string { return strconv.FormatInt(n, 10) }

func age(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return d.Round(time.Millisecond).String()
}

const timeLayout = "2006-01-02T15:04:05.000Z07:00"

func stamp(t time.Time) string { return t.UTC().Format(timeLayout) }

// printable reports whether a payload can be shown as text: valid UTF-8
// with no control characters but newlines and tabs.
func printable(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if unicode.IsControl(r) && r != '\n' && r != '\t' && r != '\r' {
			return false
		}
	}
	return true
}
