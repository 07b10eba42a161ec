package schedule

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxCronLen caps the length of an expression: a cron line is a few
// dozen bytes, and a cap keeps a hostile scene file from making the
// parser or its error messages large.
const MaxCronLen = 256

// Cron is a parsed standard 5-field cron expression: minute hour
// day-of-month month day-of-week.
//
// It supports *, lists (1,5), ranges (1-5), steps (*/15, 10-50/10), month
// names jan..dec and weekday names sun..sat (case-insensitive), 7 as
// Sunday, and the macros @yearly/@annually, @monthly, @weekly,
// @daily/@midnight and @hourly. When both day-of-month and day-of-week
// are restricted, a day matches if either matches (the Vixie rule; a
// field that starts with '*', such as "*/2", counts as unrestricted for
// this rule, as it does in Vixie cron).
//
// A Cron is immutable and safe for concurrent use.
type Cron struct {
	text string

	minute uint64 // bits 0-59
	hour   uint64 // bits 0-23
	dom    uint64 // bits 1-31
	month  uint64 // bits 1-12
	dow    uint64 // bits 0-6, Sunday is 0

	domStar, dowStar bool
	// hourStar selects elapsed-time semantics across DST changes (see
	// the package documentation).
	hourStar bool

	// dowDays[w] has bit d (1..31) set when day d of a month whose first
	// day is weekday w falls on a weekday in dow: turning day-of-week into
	// a day-of-month mask is then one AND per month.
	dowDays [7]uint64
}

type fieldSpec struct {
	name     string
	min, max int
	names    []string // names[i] is the value min+i
}

var cronFields = [5]fieldSpec{
	{name: "minute", min: 0, max: 59},
	{name: "hour", min: 0, max: 23},
	{name: "day-of-month", min: 1, max: 31},
	{name: "month", min: 1, max: 12, names: []string{"jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"}},
	// 7 is Sunday too; '*' means 0-6.
	{name: "day-of-week", min: 0, max: 7, names: []string{"sun", "mon", "tue", "wed", "thu", "fri", "sat"}},
}

var cronMacros = map[string]string{
	"@yearly":   "0 0 1 1 *",
	"@annually": "0 0 1 1 *",
	"@monthly":  "0 0 1 * *",
	"@weekly":   "0 0 * * 0",
	"@daily":    "0 0 * * *",
	"@midnight": "0 0 * * *",
	"@hourly":   "0 * * * *",
}

// ParseCron parses a 5-field cron expression or a macro. The error, a
// *CronError wrapping ErrInvalidCron, names the field and the token at
// fault. Expressions that can never fire, such as "0 0 30 2 *", are
// rejected too.
func ParseCron(expr string) (*Cron, error) {
	if len(expr) > MaxCronLen {
		return nil, &CronError{Expr: shorten(expr), Msg: fmt.Sprintf("longer than %d bytes", MaxCronLen)}
	}
	if !utf8.ValidString(expr) {
		return nil, &CronError{Expr: expr, Msg: "not valid UTF-8"}
	}
	text := strings.ToLower(strings.Join(strings.Fields(expr), " "))
	if text == "" {
		return nil, &CronError{Expr: expr, Msg: "empty expression"}
	}
	body := text
	if strings.HasPrefix(text, "@") {
		m, ok := cronMacros[text]
		if !ok {
			return nil, &CronError{Expr: expr, Token: text, Msg: "unknown macro (want @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly)"}
		}
		body = m
	}
	parts := strings.Split(body, " ")
	if len(parts) != 5 {
		msg := fmt.Sprintf("want 5 fields (minute hour day-of-month month day-of-week), got %d", len(parts))
		if len(parts) == 6 {
			msg += "; a seconds field is not supported"
		}
		return nil, &CronError{Expr: expr, Msg: msg}
	}

	c := &Cron{text: text}
	var masks [5]uint64
	var stars [5]bool
	for i, p := range parts {
		m, star, err := parseField(cronFields[i], p)
		if err != nil {
			err.Expr = expr
			return nil, err
		}
		masks[i], stars[i] = m, star
	}
	c.minute, c.hour, c.dom, c.month, c.dow = masks[0], masks[1], masks[2], masks[3], masks[4]
	c.hourStar, c.domStar, c.dowStar = stars[1], stars[2], stars[4]
	for w := range 7 {
		for d := 1; d <= 31; d++ {
			if c.dow&(1<<((w+d-1)%7)) != 0 {
				c.dowDays[w] |= 1 << d
			}
		}
	}
	if err := c.checkFires(parts[2], parts[3]); err != nil {
		err.Expr = expr
		return nil, err
	}
	return c, nil
}

// String returns the expression normalized: lower case, single spaces,
// macros kept as written. ParseCron(c.String()) is equal to c.
func (c *Cron) String() string { return c.text }

// checkFires rejects day-of-month/month combinations that never occur.
// Only the AND form of the day rule can fail: with both day fields
// restricted any weekday matches, and a day-of-month starting with '*'
// always includes the 1st.
func (c *Cron) checkFires(domText, monthText string) *CronError {
	if c.domStar || !c.dowStar {
		return nil
	}
	for m := 1; m <= 12; m++ {
		if c.month&(1<<m) != 0 && c.dom&dayBits(maxDaysIn(m)) != 0 {
			return nil
		}
	}
	return &CronError{Field: "day-of-month", Token: domText,
		Msg: fmt.Sprintf("never matches: no month in %q has such a day", monthText)}
}

func parseField(f fieldSpec, text string) (mask uint64, star bool, err *CronError) {
	star = strings.HasPrefix(text, "*")
	for item := range strings.SplitSeq(text, ",") {
		if item == "" {
			return 0, false, &CronError{Field: f.name, Token: text, Msg: "empty list item"}
		}
		m, err := parseItem(f, item)
		if err != nil {
			return 0, false, err
		}
		mask |= m
	}
	return mask, star, nil
}

func parseItem(f fieldSpec, item string) (uint64, *CronError) {
	bad := func(format string, args ...any) *CronError {
		return &CronError{Field: f.name, Token: item, Msg: fmt.Sprintf(format, args...)}
	}
	rng, stepText, hasStep := strings.Cut(item, "/")
	step := 1
	if hasStep {
		n, ok := parseNumber(stepText)
		if !ok {
			return 0, bad("step %q is not a number", stepText)
		}
		if n < 1 || n > f.max {
			return 0, bad("step must be between 1 and %d", f.max)
		}
		step = n
	}
	var lo, hi int
	switch {
	case rng == "*":
		lo, hi = f.min, f.max
		if f.name == "day-of-week" {
			hi = 6
		}
	case strings.Contains(rng, "-"):
		a, b, _ := strings.Cut(rng, "-")
		var e *CronError
		if lo, e = parseValue(f, item, a); e != nil {
			return 0, e
		}
		if hi, e = parseValue(f, item, b); e != nil {
			return 0, e
		}
		if lo > hi {
			return 0, bad("range is reversed (%d > %d)", lo, hi)
		}
	default:
		if hasStep {
			return 0, bad("a step needs a range or '*' (write %s-%d/%s)", rng, f.max, stepText)
		}
		v, e := parseValue(f, item, rng)
		if e != nil {
			return 0, e
		}
		lo, hi = v, v
	}
	var m uint64
	for v := lo; v <= hi; v += step {
		if f.name == "day-of-week" && v == 7 {
			m |= 1
			continue
		}
		m |= 1 << v
	}
	return m, nil
}

func parseValue(f fieldSpec, item, s string) (int, *CronError) {
	if s == "" {
		return 0, &CronError{Field: f.name, Token: item, Msg: "missing value"}
	}
	for i, n := range f.names {
		if s == n {
			return f.min + i, nil
		}
	}
	v, ok := parseNumber(s)
	if !ok {
		what := "a number"
		if f.names != nil {
			what = fmt.Sprintf("a number or a name (%s..%s)", f.names[0], f.names[len(f.names)-1])
		}
		return 0, &CronError{Field: f.name, Token: item, Msg: fmt.Sprintf("%q is not %s", s, what)}
	}
	if v < f.min || v > f.max {
		return 0, &CronError{Field: f.name, Token: item, Msg: fmt.Sprintf("value %s out of range %d-%d", s, f.min, f.max)}
	}
	return v, nil
}

// parseNumber accepts decimal digits only: no signs, no spaces. Long
// digit strings become a value out of every range instead of
// overflowing.
func parseNumber(s string) (int, bool) {
	if s == "" {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	s = strings.TrimLeft(s, "0")
	if s == "" {
		return 0, true
	}
	if len(s) > 4 {
		return 9999, true
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

func shorten(s string) string {
	const keep = 32
	if len(s) <= keep {
		return s
	}
	for i := keep; i > 0; i-- {
		if utf8.RuneStart(s[i]) {
			return s[:i] + "…"
		}
	}
	return ""
}

// dayBits has bits 1..n set.
func dayBits(n int) uint64 { return (uint64(1)<<(n+1) - 1) &^ 1 }

// maxDaysIn is the longest a month ever is, February counting leap
// years.
func maxDaysIn(m int) int {
	switch m {
	case 2:
		return 29
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

func daysIn(y int64, m int) int {
	if m == 2 && !isLeap(y) {
		return 28
	}
	return maxDaysIn(m)
}

func isLeap(y int64) bool { return y%4 == 0 && (y%100 != 0 || y%400 == 0) }

// next returns the lowest set bit of mask at or above from, or -1.
func next(mask uint64, from int) int {
	if from > 63 {
		return -1
	}
	m := mask >> from << from
	if m == 0 {
		return -1
	}
	return bits.TrailingZeros64(m)
}
