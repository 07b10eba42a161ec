package scenes

import (
	"errors"
	"strings"
	"testing"
	"time"
)

const scheduled = `
[[scene]]
name = "warm"
mode = "queued"
[[scene.step]]
device = "living-ac"
action = "set"
params = { power = "on", target = { from = "temperature" } }
[[scene.schedule]]
name = "weekdays"
cron = "0 7 * * mon-fri"
timezone = "Europe/Berlin"
jitter = "5m"
catch_up = "all"
catch_up_window = "48h"
params = { temperature = 22 }
[[scene.schedule]]
sun = "sunset"
offset = "-15m"
params = { temperature = 21 }
`

func TestSchedulesParseWithTheirDefaults(t *testing.T) {
	cat, err := Parse([]byte(scheduled), "s.toml", registry(t))
	if err != nil {
		t.Fatal(err)
	}
	got := cat.Schedules()
	if len(got) != 2 {
		t.Fatalf("%d schedules, want 2", len(got))
	}
	w, s := got[0], got[1]
	if w.ID() != "warm/weekdays" || w.Cron == nil || w.Zone != "Europe/Berlin" || w.Jitter != 5*time.Minute ||
		w.CatchUp != CatchUpAll || w.CatchUpWindow != 48*time.Hour || w.Params["temperature"] != int64(22) {
		t.Errorf("first schedule = %+v", w)
	}
	if s.ID() != "warm/2" || s.Sun == nil || s.Sun.Offset != -15*time.Minute || s.CatchUp != DefaultCatchUp ||
		s.CatchUpWindow != DefaultCatchUpWindow || s.Zone != "" {
		t.Errorf("second schedule = %+v", s)
	}
	if w.When() != "cron 0 7 * * mon-fri" || s.When() != "sunset -15m0s" {
		t.Errorf("When = %q, %q", w.When(), s.When())
	}
}

func TestBadSchedulesAreReportedByField(t *testing.T) {
	base := "[[scene]]\nname = \"s\"\n[[scene.step]]\ndelay = \"1s\"\n[[scene.schedule]]\n"
	for _, c := range []struct{ src, field, msg string }{
		{`cron = "0 25 * * *"`, "schedule[1].cron", "hour"},
		{`cron = "0 7 * * *"` + "\nsun = \"sunset\"", "schedule[1].cron", "not both"},
		{`name = "x"`, "schedule[1].cron", "needs cron"},
		{`sun = "noon"`, "schedule[1].sun", "noon"},
		{`sun = "dusk"` + "\noffset = \"13h\"", "schedule[1].offset", "12h"},
		{`cron = "@daily"` + "\noffset = \"1m\"", "schedule[1].offset", "sun schedules"},
		{`cron = "@daily"` + "\ntimezone = \"Mars/Olympus\"", "schedule[1].timezone", "IANA"},
		{`cron = "@daily"` + "\njitter = \"2h\"", "schedule[1].jitter", "1h"},
		{`cron = "@daily"` + "\ncatch_up = \"some\"", "schedule[1].catch_up", "skip, once, all"},
		{`cron = "@daily"` + "\ncatch_up_window = \"9000h\"", "schedule[1].catch_up_window", "8784h"},
		{`cron = "@daily"` + "\ncatch_up_window = \"30s\"", "schedule[1].catch_up_window", "1m"},
		{`cron = "@daily"` + "\nparams = { level = 3 }", "schedule[1].params", "level"},
		{`cron = "@daily"` + "\ncolour = 1", "schedule[1].colour", "unknown key"},
		{`cron = "@daily"` + "\nname = \"a/b\"", "schedule[1].name", "/"},
		{`cron = "@daily"` + "\ncatch_up = \"all\"", "schedule[1].catch_up", "use mode queued or parallel"},
		{"cron = \"@daily\"\nname = \"n\"\n[[scene.schedule]]\ncron = \"@hourly\"\nname = \"n\"", "schedule[2].name", "two schedules"},
	} {
		errs := loadErrors(t, base+c.src)
		found := false
		for _, e := range errs {
			if e.Field == c.field && strings.Contains(e.Msg, c.msg) {
				found = true
			}
		}
		if !found {
			t.Errorf("%q: errors %v, want %s mentioning %q", c.src, errs, c.field, c.msg)
		}
	}
}

func TestSchedulesWhoseFiringIDsWouldCollideAreRefused(t *testing.T) {
	src := `
[[scene]]
name = "porch-light"
[[scene.step]]
delay = "1s"
[[scene.schedule]]
name = "on"
cron = "0 18 * * *"

[[scene]]
name = "porch"
[[scene.step]]
delay = "1s"
[[scene.schedule]]
name = "light-on"
cron = "0 19 * * *"
`
	errs := loadErrors(t, src)
	if len(errs) != 1 || !strings.Contains(errs[0].Msg, "rename one") {
		t.Fatalf("errors = %v, want one naming the collision", errs)
	}
}

func TestTriggersMayNotUseTheSchedulesPrefix(t *testing.T) {
	_, err := DecodeTrigger([]byte(`{"scene":"go_home","request_id":"sched-go_home-1-20261202T060000Z"}`))
	var te *TriggerError
	if !errors.As(err, &te) || te.Reason != ReasonInvalidField {
		t.Fatalf("err = %v, want invalid_field", err)
	}
}
