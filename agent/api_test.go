package agent

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/driver/drivertest"
	"github.com/sortie-edge/sortie/scenes"
	"github.com/sortie-edge/sortie/store"
)

// apiScenes are the scenes of the API tests (and of cmd/agent's CLI
// tests): a held single-mode scene, a parallel one for volume, and one
// with a bounded trigger parameter.
var apiScenes = func() string {
	b, err := os.ReadFile("testdata/gated.toml")
	if err != nil {
		panic(err) // the package's own file
	}
	return string(b)
}()

// fakeDevices stands in for the devices client: the API only reads it.
type fakeDevices struct {
	connected atomic.Bool
	offline   map[string]bool
	states    map[string]map[string]any
}

func (f *fakeDevices) Connected() bool          { return f.connected.Load() }
func (f *fakeDevices) Available(id string) bool { return !f.offline[id] }
func (f *fakeDevices) State(id string) (map[string]any, bool) {
	s, ok := f.states[id]
	return s, ok
}

// apiFixture is the API over a real driver, a real bbolt store and the
// real trigger service.
type apiFixture struct {
	api   *api.Handler
	srv   *httptest.Server
	drv   *driver.Driver
	gate  *drivertest.Gate
	watch *drivertest.Watcher
	devs  *fakeDevices
	token string
	// writeErr is what the store's WriteError says.
	writeErr atomic.Pointer[error]
}

func newAPIFixture(t testing.TB, token string, tune ...func(*driver.Options)) *apiFixture {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg, cat := parseScenes(t, apiScenes, "api.toml")
	db, err := store.Open(filepath.Join(t.TempDir(), "missions.db"), store.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	dopts := driver.Options{Store: db, Logger: log, StopGrace: time.Second}
	for _, f := range tune {
		f(&dopts)
	}
	drv, err := driver.New(dopts)
	if err != nil {
		t.Fatal(err)
	}
	f := &apiFixture{
		drv: drv, token: token,
		gate:  drivertest.NewGate(),
		watch: drivertest.NewWatcher(),
		devs: &fakeDevices{
			offline: map[string]bool{"living-ac": true},
			states:  map[string]map[string]any{"living-light": {"power": "on", "brightness": int64(80)}},
		},
	}
	f.devs.connected.Store(true)
	drv.Register(scenes.DelayKind, f.gate)
	drv.Register(devices.KindCommand, f.gate)
	trig := newTriggers(log, cat, drv, discardPublisher{}, newAgentTopics("sortie", "test"), newInstruments())
	drv.Observe(f.watch)
	drv.Observe(trig)
	ctx, cancel := context.WithCancel(context.Background())
	if err := drv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	trigDone := make(chan struct{})
	go func() { defer close(trigDone); _ = trig.Run(ctx) }()
	f.api = api.New(api.Options{Log: log, Token: token, Driver: drv, Devices: f.devs, Registry: reg, Catalog: cat, Trigger: trig.Call,
		WriteError: func() error {
			if p := f.writeErr.Load(); p != nil {
				return *p
			}
			return nil
		}})
	mux := http.NewServeMux()
	f.api.Register(mux)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(func() {
		f.srv.Close()
		cancel()
		<-trigDone
		// A held step must not keep Stop waiting.
		f.gate.Open()
		if err := drv.Stop(context.Background()); err != nil {
			t.Errorf("driver stop: %v", err)
		}
	})
	return f
}

type discardPublisher struct{}

func (discardPublisher) Publish(string, byte, bool, []byte) error { return nil }

// do calls the API and decodes the answer into out (when not nil).
func (f *apiFixture) do(t *testing.T, method, path, body string, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if f.token != "" {
		req.Header.Set("Authorization", "Bearer "+f.token)
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }() // read to the end: nothing left to report
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q", method, path, ct)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	return resp.StatusCode
}

// submit runs scene and returns the new mission's ID.
func (f *apiFixture) submit(t *testing.T, scene, requestID string) string {
	t.Helper()
	var rep scenes.Reply
	body := `{"scene":"` + scene + `","request_id":"` + requestID + `"}`
	if code := f.do(t, "POST", "/api/missions", body, &rep); code != http.StatusCreated || rep.MissionID == "" {
		t.Fatalf("submit %s: %d %+v", scene, code, rep)
	}
	return rep.MissionID
}

// wantError checks an error answer's status and code.
func (f *apiFixture) wantError(t *testing.T, method, path, body string, status int, code string) api.Error {
	t.Helper()
	var e api.Error
	if got := f.do(t, method, path, body, &e); got != status || e.Error.Code != code || e.Error.Message == "" {
		t.Errorf("%s %s: %d %+v, want %d %s with a message", method, path, got, e, status, code)
	}
	return e
}

func TestAPIAuth(t *testing.T) {
	f := newAPIFixture(t, "s3cret")
	cases := []struct {
		name, path, header string
		want               int
	}{
		{"no token", "/api/missions", "", http.StatusUnauthorized},
		{"wrong token", "/api/missions", "Bearer nope", http.StatusUnauthorized},
		{"not bearer", "/api/missions", "Basic czNjcmV0", http.StatusUnauthorized},
		{"prefix of token", "/api/scenes", "Bearer s3c", http.StatusUnauthorized},
		{"good token", "/api/missions", "Bearer s3cret", http.StatusOK},
		{"unknown path needs a token too", "/api/nope", "", http.StatusUnauthorized},
		{"healthz is open", "/healthz", "", http.StatusOK},
		{"readyz is open", "/readyz", "", http.StatusOK},
		{"the root says what is here, open", "/", "", http.StatusOK},
		{"other paths are not found", "/nope", "", http.StatusNotFound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", f.srv.URL+c.path, nil)
			if c.header != "" {
				req.Header.Set("Authorization", c.header)
			}
			resp, err := f.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = resp.Body.Close() }() // the status is what this checks
			body, _ := io.ReadAll(resp.Body)
			var e api.Error
			_ = json.Unmarshal(body, &e)
			if resp.StatusCode != c.want {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.want)
			}
			if c.path == "/" && !strings.Contains(string(body), "/api/missions") {
				t.Errorf("the root's text lacks the endpoints: %q", body)
			}
			if c.want == http.StatusUnauthorized && (e.Error.Code != api.CodeUnauthorized || resp.Header.Get("WWW-Authenticate") == "") {
				t.Errorf("401 without the error body or challenge: %+v", e)
			}
		})
	}
}

func TestAPIBadInput(t *testing.T) {
	f := newAPIFixture(t, "")
	id := f.submit(t, "many", "bad-input-1")
	f.watch.Wait(t, id, driver.StateSucceeded)
	big := `{"scene":"many","request_id":"big","params":{"x":"` + strings.Repeat("a", api.MaxBodySize) + `"}}`
	mid := `{"scene":"many","request_id":"mid","params":{"x":"` + strings.Repeat("a", scenes.MaxTriggerSize) + `"}}`
	cases := []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"unknown mission", "GET", "/api/missions/nope", "", 404, api.CodeNotFound},
		{"control unknown mission", "POST", "/api/missions/nope/cancel", "", 404, api.CodeNotFound},
		{"unknown action", "POST", "/api/missions/" + id + "/explode", "", 404, api.CodeNotFound},
		{"unknown endpoint", "GET", "/api/nope", "", 404, api.CodeNotFound},
		{"wrong method", "DELETE", "/api/missions/" + id, "", 405, api.CodeMethodNotAllowed},
		{"wrong method on a list", "PUT", "/api/missions", "", 405, api.CodeMethodNotAllowed},
		{"wrong method on an action", "GET", "/api/missions/" + id + "/cancel", "", 405, api.CodeMethodNotAllowed},
		{"not json", "POST", "/api/missions", "hello", 400, scenes.ReasonBadJSON},
		{"trailing data", "POST", "/api/missions", `{"scene":"many"} {}`, 400, scenes.ReasonBadJSON},
		{"unknown field", "POST", "/api/missions", `{"scene":"many","sceen":"x"}`, 400, scenes.ReasonBadJSON},
		{"missing scene", "POST", "/api/missions", `{"request_id":"r"}`, 400, scenes.ReasonMissingField},
		{"unknown scene", "POST", "/api/missions", `{"scene":"nope"}`, 404, scenes.ReasonUnknownScene},
		{"unsafe request id", "POST", "/api/missions", `{"scene":"many","request_id":"a/b"}`, 400, scenes.ReasonInvalidField},
		{"param out of range", "POST", "/api/missions", `{"scene":"cool","params":{"temperature":40}}`, 400, scenes.ReasonInvalidParam},
		{"params not object", "POST", "/api/missions", `{"scene":"cool","params":[1]}`, 400, scenes.ReasonInvalidField},
		{"body over the API limit", "POST", "/api/missions", big, 413, api.CodeTooLarge},
		{"trigger over the trigger limit", "POST", "/api/missions", mid, 413, scenes.ReasonTooLarge},
		{"body on an action", "POST", "/api/missions/" + id + "/cancel", `{"force":true}`, 400, api.CodeBadRequest},
		{"cancel finished", "POST", "/api/missions/" + id + "/cancel", "", 409, api.CodeConflict},
		{"pause finished", "POST", "/api/missions/" + id + "/pause", "{}", 409, api.CodeConflict},
		{"retry succeeded", "POST", "/api/missions/" + id + "/retry", "", 409, api.CodeConflict},
		{"resume not paused", "POST", "/api/missions/" + id + "/resume", "", 409, api.CodeConflict},
		{"priority missing", "POST", "/api/missions/" + id + "/priority", `{}`, 400, api.CodeBadRequest},
		{"priority not a number", "POST", "/api/missions/" + id + "/priority", `{"priority":"high"}`, 400, scenes.ReasonBadJSON},
		{"priority out of range", "POST", "/api/missions/" + id + "/priority", `{"priority":101}`, 400, api.CodeBadRequest},
		{"priority of finished", "POST", "/api/missions/" + id + "/priority", `{"priority":10}`, 409, api.CodeConflict},
		{"bad state", "GET", "/api/missions?state=DONE", "", 400, api.CodeBadRequest},
		{"bad limit", "GET", "/api/missions?limit=0", "", 400, api.CodeBadRequest},
		{"limit too big", "GET", "/api/missions?limit=100000", "", 400, api.CodeBadRequest},
		{"bad since", "GET", "/api/missions?since=yesterday", "", 400, api.CodeBadRequest},
		{"bad cursor", "GET", "/api/missions?cursor=zz", "", 400, api.CodeBadRequest},
		{"unknown parameter", "GET", "/api/missions?sate=RUNNING", "", 400, api.CodeBadRequest},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.code == "" {
				if got := f.do(t, c.method, c.path, c.body, nil); got != c.status {
					t.Errorf("status %d, want %d", got, c.status)
				}
				return
			}
			f.wantError(t, c.method, c.path, c.body, c.status, c.code)
		})
	}
	e := f.wantError(t, "GET", "/api/missions/0190nope", "", 404, api.CodeNotFound)
	if e.Error.Message != "mission 0190nope not found" {
		t.Errorf("message %q, want it to name the mission", e.Error.Message)
	}
}

func TestAPISubmitModesAndIdempotency(t *testing.T) {
	f := newAPIFixture(t, "")
	f.gate.Hold.Store(true)
	id := f.submit(t, "solo", "solo-1")
	<-f.gate.Entered
	var rep scenes.Reply
	if code := f.do(t, "POST", "/api/missions", `{"scene":"solo","request_id":"solo-1"}`, &rep); code != 200 || !rep.Duplicate || rep.MissionID != id {
		t.Errorf("repeated request: %d %+v, want 200 duplicate of %s", code, rep, id)
	}
	e := f.wantError(t, "POST", "/api/missions", `{"scene":"solo","request_id":"solo-2"}`, 409, scenes.ReasonAlreadyRunning)
	if !strings.Contains(e.Error.Message, id) {
		t.Errorf("already_running message %q does not name %s", e.Error.Message, id)
	}
	f.gate.Release <- struct{}{}
	f.watch.Wait(t, id, driver.StateSucceeded)
	// Without a request ID each submit is new; params reach the mission.
	f.gate.Hold.Store(false)
	var a, b scenes.Reply
	f.do(t, "POST", "/api/missions", `{"scene":"cool","params":{"temperature":21}}`, &a)
	f.do(t, "POST", "/api/missions", `{"scene":"cool"}`, &b)
	if a.MissionID == "" || a.MissionID == b.MissionID || !strings.HasPrefix(a.RequestID, "http-") {
		t.Fatalf("submits without request IDs: %+v %+v", a, b)
	}
	var d api.MissionDetail
	f.do(t, "GET", "/api/missions/"+a.MissionID, "", &d)
	var p devices.CommandParams
	_ = json.Unmarshal(d.Mission.Steps[0].Params, &p)
	if d.Mission.Meta.Source != "http" || p.Params["target"] != float64(21) {
		t.Errorf("mission from HTTP: source %q, step params %s", d.Mission.Meta.Source, d.Mission.Steps[0].Params)
	}
}

func TestAPIPauseResumeCancelRetry(t *testing.T) {
	f := newAPIFixture(t, "")
	f.gate.Hold.Store(true)
	control := func(id, action, body string) api.MissionItem {
		t.Helper()
		var it api.MissionItem
		if code := f.do(t, "POST", "/api/missions/"+id+"/"+action, body, &it); code != 200 {
			t.Fatalf("%s: status %d", action, code)
		}
		return it
	}

	// Pause while a step runs: requested now, taken at the step boundary.
	id := f.submit(t, "many", "prc-1")
	<-f.gate.Entered
	if it := control(id, "pause", ""); !it.Control.Pause || it.State != driver.StateStepRunning {
		t.Errorf("pause during a step: %+v", it)
	}
	f.gate.Release <- struct{}{}
	f.watch.Wait(t, id, driver.StatePaused)
	if it := control(id, "priority", `{"priority":90}`); it.Priority != 90 {
		t.Errorf("priority: %+v", it)
	}
	if it := control(id, "resume", ""); it.State != driver.StateRunning {
		t.Errorf("resume: %+v", it)
	}
	<-f.gate.Entered
	f.gate.Release <- struct{}{}
	f.watch.Wait(t, id, driver.StateSucceeded)

	// Cancel while paused.
	id = f.submit(t, "many", "prc-2")
	<-f.gate.Entered
	control(id, "pause", "")
	f.gate.Release <- struct{}{}
	f.watch.Wait(t, id, driver.StatePaused)
	if it := control(id, "cancel", ""); it.State != driver.StateCancelled && !it.Control.Cancel {
		t.Errorf("cancel paused: %+v", it)
	}
	f.watch.Wait(t, id, driver.StateCancelled)

	// Retry a failed mission.
	f.gate.Hold.Store(false)
	f.gate.Fail.Store(true)
	id = f.submit(t, "many", "prc-3")
	f.watch.Wait(t, id, driver.StateFailed)
	f.gate.Fail.Store(false)
	control(id, "retry", "")
	f.watch.Wait(t, id, driver.StateSucceeded)

	var d api.MissionDetail
	f.do(t, "GET", "/api/missions/"+id, "", &d)
	var inputs []string
	for _, ev := range d.Timeline {
		inputs = append(inputs, string(ev.Input))
	}
	if got := strings.Join(inputs, " "); !strings.Contains(got, "step_error fail retry") || !strings.HasSuffix(got, "complete") {
		t.Errorf("timeline of the retried mission: %s", got)
	}
	if d.Mission.Progress.Gen != 1 {
		t.Errorf("retried mission has gen %d, want 1", d.Mission.Progress.Gen)
	}
}

func TestAPIListPaging(t *testing.T) {
	f := newAPIFixture(t, "")
	var ids []string
	for i := range 5 {
		id := f.submit(t, "many", "page-"+string(rune('a'+i)))
		f.watch.Wait(t, id, driver.StateSucceeded)
		ids = append(ids, id)
	}
	var got []string
	cursor, pages := "", 0
	for {
		var l api.MissionList
		path := "/api/missions?limit=2&state=succeeded,failed&scene=many"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		if code := f.do(t, "GET", path, "", &l); code != 200 {
			t.Fatalf("list: %d", code)
		}
		pages++
		for _, m := range l.Missions {
			got = append(got, m.ID)
		}
		if cursor = l.NextCursor; cursor == "" {
			break
		}
	}
	want := []string{ids[4], ids[3], ids[2], ids[1], ids[0]}
	if strings.Join(got, ",") != strings.Join(want, ",") || pages != 3 {
		t.Errorf("paged list %v in %d pages, want %v in 3 (newest first)", got, pages, want)
	}
	var l api.MissionList
	f.do(t, "GET", "/api/missions?state=FAILED", "", &l)
	if len(l.Missions) != 0 {
		t.Errorf("state filter: %d missions, want none", len(l.Missions))
	}
	f.do(t, "GET", "/api/missions?since=1h&until="+time.Now().Add(time.Hour).UTC().Format(time.RFC3339), "", &l)
	if len(l.Missions) != 5 {
		t.Errorf("since/until: %d missions, want 5", len(l.Missions))
	}
}

func TestAPIDevicesAndScenes(t *testing.T) {
	f := newAPIFixture(t, "")
	var dl api.DeviceList
	if code := f.do(t, "GET", "/api/devices", "", &dl); code != 200 || !dl.Connected {
		t.Fatalf("devices: %d %+v", code, dl)
	}
	byID := map[string]api.DeviceItem{}
	for _, d := range dl.Devices {
		byID[d.ID] = d
	}
	if d := byID["living-light"]; d.Type != "light" || d.Room != "living" || !d.Available || d.State["brightness"] != float64(80) {
		t.Errorf("living-light: %+v", d)
	}
	if d := byID["living-ac"]; d.Available || d.State != nil {
		t.Errorf("offline living-ac without state: %+v", d)
	}
	var sl api.SceneList
	f.do(t, "GET", "/api/scenes", "", &sl)
	if len(sl.Scenes) != 3 {
		t.Fatalf("scenes: %+v", sl)
	}
	cool := sl.Scenes[0]
	if cool.Name != "cool" || cool.Mode != scenes.ModeParallel || cool.Steps != 1 || len(cool.Params) != 1 ||
		cool.Params[0].Name != "temperature" || cool.Params[0].Required || cool.Params[0].Default != float64(24) {
		t.Errorf("scene cool: %+v", cool)
	}
	if solo := sl.Scenes[2]; solo.Name != "solo" || solo.Deadline.D() != scenes.DefaultDeadline || solo.Description == "" {
		t.Errorf("scene solo: %+v", solo)
	}
}

func TestAPIReadinessAndShutdown(t *testing.T) {
	f := newAPIFixture(t, "")
	var r api.Readiness
	if code := f.do(t, "GET", "/readyz", "", &r); code != 200 || r.Status != "ready" {
		t.Errorf("readyz: %d %+v", code, r)
	}
	f.devs.connected.Store(false)
	if code := f.do(t, "GET", "/readyz", "", &r); code != 503 || len(r.Reasons) != 1 || !strings.HasPrefix(r.Reasons[0], "devices:") {
		t.Errorf("readyz without broker: %d %+v", code, r)
	}
	f.devs.connected.Store(true)
	full := errors.New("append to the log: no space left on device")
	f.writeErr.Store(&full)
	if code := f.do(t, "GET", "/readyz", "", &r); code != 503 || len(r.Reasons) != 1 || !strings.Contains(r.Reasons[0], "no space left") {
		t.Errorf("readyz while every write fails: %d %+v", code, r)
	}
	f.writeErr.Store(nil)
	f.api.Shutdown()
	if code := f.do(t, "GET", "/readyz", "", &r); code != 503 || !strings.Contains(strings.Join(r.Reasons, ";"), "shutting down") {
		t.Errorf("readyz while stopping: %d %+v", code, r)
	}
	f.wantError(t, "POST", "/api/missions", `{"scene":"many"}`, 503, api.CodeShuttingDown)
	if code := f.do(t, "GET", "/healthz", "", nil); code != 200 {
		t.Errorf("healthz while stopping: %d", code)
	}
}

// FuzzAPISubmit: whatever the body, a submit answers JSON with a 2xx or
// a 4xx and a coded error, never a 5xx.
func FuzzAPISubmit(f *testing.F) {
	for _, b := range []string{
		`{"scene":"many"}`, `{"scene":"cool","params":{"temperature":21},"request_id":"r1","source":"fuzz"}`,
		`{"scene":"cool","params":{"temperature":1e400}}`, `{"scene":"solo","params":{"a":[1]}}`, `{}`, `[]`, `null`, `{"scene":"x/y"}`,
		`{"scene":"many","request_id":"` + strings.Repeat("r", 200) + `"}`, "\x00", `{"scene":"many"}garbage`,
	} {
		f.Add(b)
	}
	fx := newAPIFixture(f, "")
	f.Fuzz(func(t *testing.T, body string) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("POST", "/api/missions", strings.NewReader(body))
		fx.srv.Config.Handler.ServeHTTP(rec, req)
		var e api.Error
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
			t.Fatalf("answer to %q is not JSON: %v: %s", body, err, rec.Body)
		}
		switch {
		case rec.Code == 200 || rec.Code == 201:
		case rec.Code >= 400 && rec.Code < 500 && e.Error.Code != "" && e.Error.Message != "":
		default:
			t.Fatalf("answer to %q: %d %s", body, rec.Code, rec.Body)
		}
	})
}

// With max_live missions live, a new trigger through the API is 503
// overloaded with Retry-After, as a full queue is; the same request sent
// again gets its mission.
func TestAPIMaxLiveIsOverloadedWithRetryAfter(t *testing.T) {
	f := newAPIFixture(t, "", func(o *driver.Options) { o.MaxLive = 1 })
	f.gate.Hold.Store(true)
	id := f.submit(t, "many", "live-1")
	<-f.gate.Entered
	req, err := http.NewRequest("POST", f.srv.URL+"/api/missions", strings.NewReader(`{"scene":"many","request_id":"live-2"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var e api.Error
	_ = json.NewDecoder(resp.Body).Decode(&e)
	_ = resp.Body.Close() // decoded
	if resp.StatusCode != http.StatusServiceUnavailable || e.Error.Code != scenes.ReasonOverloaded || resp.Header.Get("Retry-After") != "1" || !strings.Contains(e.Error.Message, "max_live") {
		t.Errorf("beyond max_live: %d %+v, Retry-After %q; want 503 overloaded naming max_live, with Retry-After 1", resp.StatusCode, e, resp.Header.Get("Retry-After"))
	}
	var rep scenes.Reply
	if code := f.do(t, "POST", "/api/missions", `{"scene":"many","request_id":"live-1"}`, &rep); code != 200 || !rep.Duplicate || rep.MissionID != id {
		t.Errorf("the live request sent again: %d %+v, want 200 duplicate of %s", code, rep, id)
	}
	f.gate.Release <- struct{}{}
	<-f.gate.Entered
	f.gate.Release <- struct{}{}
	f.watch.Wait(t, id, driver.StateSucceeded)
}
