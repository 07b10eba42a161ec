package hub

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/uplink"
)

// compensatedMission is the timeline of a six-step mission whose last
// step jammed a lock: its first step took 400 µs, its second was a
// delay (a wait, not an error), and the five steps done were undone.
func compensatedMission(id string, t0 time.Time) []uplink.Entry {
	steps := []string{"1-light", "2-delay", "3-ac", "4-blinds", "5-music", "6-lock"}
	errMsg := "step 6-lock failed: Front door lock (hall): lock mechanism jammed (command " + id + "-5-1)"
	sum := driver.Summary{Scene: "movie_night", State: driver.StateRunning, Steps: 6, StepIDs: steps, Created: t0, Updated: t0}
	var out []uplink.Entry
	at := t0
	add := func(d time.Duration, ev driver.Event, st driver.State) {
		at = at.Add(d)
		ev.MissionID, ev.Seq, ev.Time, ev.Type = id, uint64(len(out)+1), at, "transition"
		if ev.To == "" {
			ev.To = st
		}
		sum.State, sum.Updated = st, at
		if ev.Step >= 0 {
			sum.Step = ev.Step
		}
		out = append(out, uplink.Entry{Seq: uint64(len(out) + 1), Event: ev, Mission: sum})
	}
	add(0, driver.Event{Input: driver.InStart, From: driver.StatePending, Step: -1}, driver.StateRunning)
	add(time.Millisecond, driver.Event{Input: driver.InBeginStep, From: driver.StateRunning, Step: 0, StepID: steps[0], Attempt: 1}, driver.StateStepRunning)
	add(400*time.Microsecond, driver.Event{Input: driver.InStepOK, From: driver.StateStepRunning, Step: 0, StepID: steps[0], Attempt: 1}, driver.StateStepSucceeded)
	add(time.Millisecond, driver.Event{Input: driver.InBeginStep, From: driver.StateRunning, Step: 1, StepID: steps[1], Attempt: 1}, driver.StateStepRunning)
	add(time.Millisecond, driver.Event{Input: driver.InStepWait, From: driver.StateStepRunning, Step: 1, StepID: steps[1], Attempt: 1, Error: "waiting 2s", Code: "delay", Detail: "not_ready"}, driver.StateStepFailed)
	add(2*time.Second, driver.Event{Input: driver.InStepOK, From: driver.StateStepRunning, Step: 1, StepID: steps[1], Attempt: 1}, driver.StateStepSucceeded)
	for i := 2; i < 5; i++ {
		add(time.Millisecond, driver.Event{Input: driver.InBeginStep, From: driver.StateRunning, Step: i, StepID: steps[i], Attempt: 1}, driver.StateStepRunning)
		add(120*time.Millisecond, driver.Event{Input: driver.InStepOK, From: driver.StateStepRunning, Step: i, StepID: steps[i], Attempt: 1}, driver.StateStepSucceeded)
	}
	add(time.Millisecond, driver.Event{Input: driver.InBeginStep, From: driver.StateRunning, Step: 5, StepID: steps[5], Attempt: 1}, driver.StateStepRunning)
	add(80*time.Millisecond, driver.Event{Input: driver.InStepError, From: driver.StateStepRunning, Step: 5, StepID: steps[5], Attempt: 1,
		Error: "Front door lock (hall): lock mechanism jammed (command " + id + "-5-1)", Code: "jammed", Detail: "permanent"}, driver.StateStepFailed)
	sum.Error, sum.Reason = errMsg, "step_failed"
	add(0, driver.Event{Input: driver.InCompensate, From: driver.StateStepFailed, Step: 5, StepID: steps[5], Error: errMsg, Code: "jammed"}, driver.StateCompensating)
	for i := 4; i >= 0; i-- {
		sum.Undone++
		add(30*time.Millisecond, driver.Event{Input: driver.InCompResult, From: driver.StateCompensating, Step: i, StepID: steps[i], Attempt: 1, Detail: "undone"}, driver.StateCompensating)
	}
	done := 5
	sum.Done = &done
	sum.Finished = at.Add(time.Millisecond)
	add(time.Millisecond, driver.Event{Input: driver.InFail, From: driver.StateCompensating, Step: -1, Error: errMsg}, driver.StateFailed)
	return out
}

// TestDashboardTellsTheTruth pins what the page shows in headless
// Chromium for the cases an operator misreads: a mission that failed on
// its last step and was undone (5/6 and "undone", the device named, the
// command ID only in the detail, only Retry offered), a deep link to it,
// millisecond durations and relative times, a delay that is not drawn
// as an error, failures per gateway, an offline gateway (no device
// availability, no Run scene), and a scene picker with parameters that
// reach the gateway typed.
func TestDashboardTellsTheTruth(t *testing.T) {
	bin := needChromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	e := newEnv(t, "home", "cellar")
	devs := []uplink.DeviceState{
		{ID: "front-door", Type: "lock", Name: "Front door lock", Room: "hall", Online: true},
		{ID: "boiler", Type: "switch", Online: true},
	}
	cellar := newGateway(t, e.broker.URL(), "cellar")
	cellar.online(t)
	e.waitOnline(t, "cellar")
	cellar.publish(t, cellar.topics.Heartbeat("cellar"), false, uplink.Heartbeat{Gateway: "cellar", Devices: devs, Time: time.Now()})
	cellar.publish(t, cellar.topics.Status("cellar"), true, uplink.Status{Gateway: "cellar", State: uplink.StateOffline, Time: time.Now()})

	home := newGateway(t, e.broker.URL(), "home")
	home.online(t)
	e.waitOnline(t, "home")
	home.publish(t, home.topics.Heartbeat("home"), false, uplink.Heartbeat{Gateway: "home", Devices: devs, Time: time.Now(), Scenes: []uplink.SceneInfo{
		{Name: "good_night"},
		{Name: "movie_night", Description: "dim and play", Params: []uplink.SceneParam{
			{Name: "brightness", Default: 20.0}, {Name: "room", Required: true}, {Name: "title", Default: "news"},
		}},
	}})
	entries := compensatedMission("m-undone", time.Now().Add(-time.Minute))
	home.send(t, entries...)
	home.waitAck(t, uint64(len(entries)))

	// The deep link opens the mission on load.
	page := openDashboard(t, ctx, bin, e.http.URL+"/?token="+testToken+"#/gateways/home/missions/m-undone")
	page.waitFor(t, ctx, `!document.querySelector("#detail-panel").hidden && document.querySelector("#d-title").textContent === "home / m-undone" && document.querySelectorAll("#d-steps tbody tr").length === 6`)
	if got := page.str(t, ctx, `location.hash`); got != "#/gateways/home/missions/m-undone" {
		t.Errorf("hash = %q, want the mission's deep link kept", got)
	}

	row := `document.querySelector('#missions tr[data-mission="m-undone"]')`
	page.waitFor(t, ctx, row+` !== null`)
	for _, c := range []struct{ what, expr, want string }{
		{"steps done", row + `.querySelector(".progress").textContent`, "5/6, 5 undone"},
		{"undone badge", row + `.querySelector(".badge.undone").textContent`, "undone"},
		{"error names the device, not the command", row + `.querySelector("td.err").textContent`, "step 6-lock failed: Front door lock (hall): lock mechanism jammed"},
		{"command ID kept in the tooltip", `String(` + row + `.querySelector("td.err").title.includes("(command m-undone-5-1)"))`, "true"},
		{"detail shows the command ID", `String(document.querySelector("#d-summary .detail").textContent.includes("command m-undone-5-1"))`, "true"},
		{"sub-millisecond duration", `document.querySelector('#d-steps tbody tr[data-status="compensated"] td.dur').textContent`, "0.40 ms"},
		{"seconds duration", `document.querySelectorAll('#d-steps tbody tr td.dur')[1].textContent`, "2.00 s"},
		{"delay wait is a note", `document.querySelector('#d-timeline tr[data-input="step_wait"] td:last-child').className`, "note"},
		{"failure is an error", `document.querySelector('#d-timeline tr[data-input="step_error"] td:last-child').className`, "err"},
		{"pause refused on FAILED", `String(document.querySelector('.controls button[data-action="pause"]').disabled)`, "true"},
		{"resume refused on FAILED", `String(document.querySelector('.controls button[data-action="resume"]').disabled)`, "true"},
		{"cancel refused on FAILED", `String(document.querySelector('.controls button[data-action="cancel"]').disabled)`, "true"},
		{"retry offered on FAILED", `String(document.querySelector('.controls button[data-action="retry"]').disabled)`, "false"},
		{"failures in 24 h", `document.querySelector('.gw[data-gateway="home"] .failed').textContent`, "1 failed in the last 24 h"},
		{"offline gateway's devices", `document.querySelector('.gw[data-gateway="cellar"] details summary').textContent`, "2 devices (availability unknown while the gateway is offline)"},
		{"offline gateway cannot run scenes", `String(document.querySelector('.gw[data-gateway="cellar"] button') === null)`, "true"},
		{"device named with its room", `document.querySelector('.gw[data-gateway="home"] details li').textContent`, "Front door lock [front-door] (lock, hall) online"},
	} {
		if got := page.str(t, ctx, c.expr); got != c.want {
			t.Errorf("%s: got %q, want %q", c.what, got, c.want)
		}
	}
	// Times are relative, with the absolute time to the millisecond in
	// the tooltip.
	rel := page.str(t, ctx, row+`.querySelector(".time").textContent + "|" + `+row+`.querySelector(".time").title`)
	if text, title, _ := strings.Cut(rel, "|"); !strings.Contains(text, "ago") || !strings.ContainsAny(title, "0123456789") || !containsMillis(title) {
		t.Errorf("updated cell = %q (title %q), want a relative time with an absolute tooltip to the millisecond", text, title)
	}

	// Closing drops the hash; the back button brings the mission back.
	page.eval(t, ctx, `document.querySelector("#d-close").click()`)
	page.waitFor(t, ctx, `document.querySelector("#detail-panel").hidden && location.hash === ""`)
	page.eval(t, ctx, `history.back()`)
	page.waitFor(t, ctx, `!document.querySelector("#detail-panel").hidden && location.hash === "#/gateways/home/missions/m-undone"`)

	// The scene picker shows the scene's parameters and sends them typed:
	// brightness as a number, room as text, title left to its default.
	page.eval(t, ctx, `(() => { const s = document.querySelector('.gw[data-gateway="home"] select[name="scene"]'); s.value = "movie_night"; s.dispatchEvent(new Event("change")); })()`)
	page.waitFor(t, ctx, `document.querySelectorAll('.gw[data-gateway="home"] .params input').length === 3`)
	if got := page.str(t, ctx, `document.querySelector('.gw[data-gateway="home"] .params input[name="brightness"]').placeholder`); got != "20" {
		t.Errorf("brightness placeholder = %q, want its default 20", got)
	}
	page.eval(t, ctx, `(() => { const c = document.querySelector('.gw[data-gateway="home"]');
	  c.querySelector('input[name="brightness"]').value = "35"; c.querySelector('input[name="room"]').value = "den";
	  c.querySelector('button[data-action="trigger"]').click(); })()`)
	c := home.waitControl(t)
	params, _ := json.Marshal(c.Params)
	if c.Action != uplink.ActionTrigger || c.Scene != "movie_night" || string(params) != `{"brightness":35,"room":"den"}` {
		t.Fatalf("control = %+v (params %s), want movie_night with brightness 35 and room den", c, params)
	}
	home.publish(t, home.topics.ControlResult("home"), false, uplink.ControlResult{ID: c.ID, OK: true, MissionID: "m-new", State: driver.StatePending})
	page.waitFor(t, ctx, `document.querySelector("#control-result").textContent.includes("trigger movie_night ok (PENDING)") && document.querySelector('#control-result a').getAttribute("href") === "#/gateways/home/missions/m-new"`)

	// A heartbeat while a scene is being picked keeps the pick.
	page.eval(t, ctx, `document.querySelector('.gw[data-gateway="home"] input[name="room"]').value = "attic"`)
	home.publish(t, home.topics.Heartbeat("home"), false, uplink.Heartbeat{Gateway: "home", Devices: devs[:1], Time: time.Now(), Scenes: []uplink.SceneInfo{
		{Name: "good_night"},
		{Name: "movie_night", Description: "dim and play", Params: []uplink.SceneParam{
			{Name: "brightness", Default: 20.0}, {Name: "room", Required: true}, {Name: "title", Default: "news"},
		}},
	}})
	page.waitFor(t, ctx, `document.querySelector('.gw[data-gateway="home"] details summary').textContent === "1 device (1 online)"`)
	if got := page.str(t, ctx, `document.querySelector('.gw[data-gateway="home"] input[name="room"]').value`); got != "attic" {
		t.Errorf("typed parameter after a heartbeat = %q, want it kept", got)
	}
}

func containsMillis(s string) bool {
	for i := 0; i+4 <= len(s); i++ {
		if (s[i] == '.' || s[i] == ',') && isDigits(s[i+1:i+4]) {
			return true
		}
	}
	return false
}

func isDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

// str evaluates expr in the page and returns it as a string.
func (p *cdpPage) str(t *testing.T, ctx context.Context, expr string) string {
	t.Helper()
	raw, err := p.evaluate(ctx, expr)
	if err != nil {
		t.Fatalf("eval %s: %v", expr, err)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return fmt.Sprintf("<%s>", raw)
	}
	return s
}
