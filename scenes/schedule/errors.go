package schedule

import (
	"errors"
	"strconv"
	"strings"
)

// Sentinel errors of the package.
var (
	// ErrInvalidCron is wrapped by every *CronError, so a caller can tell
	// a bad expression from other failures with errors.Is.
	ErrInvalidCron = errors.New("invalid cron expression")
	// ErrInvalidSun is wrapped by every error from ParseEvent and
	// Sun.Validate.
	ErrInvalidSun = errors.New("invalid sun schedule")
)

// CronError says why ParseCron rejected an expression. Field is the
// field's name ("minute", "hour", "day-of-month", "month",
// "day-of-week"), empty when the problem is the expression as a whole;
// Token is the offending piece of text.
type CronError struct {
	Expr  string
	Field string
	Token string
	Msg   string
}

func (e *CronError) Error() string {
	var b strings.Builder
	b.WriteString("cron ")
	b.WriteString(strconv.Quote(e.Expr))
	if e.Field != "" {
		b.WriteString(": ")
		b.WriteString(e.Field)
	}
	if e.Token != "" || e.Field != "" {
		b.WriteString(": ")
		b.WriteString(strconv.Quote(e.Token))
	}
	b.WriteString(": ")
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap makes errors.Is(err, ErrInvalidCron) hold.
func (e *CronError) Unwrap() error { return ErrInvalidCron }
