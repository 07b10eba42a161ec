package hub

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/uplink"
)

func TestAPIAuth(t *testing.T) {
	e := newEnv(t, "gw")
	cases := []struct {
		name, path, auth string
		want             int
	}{
		{"no token", "/api/gateways", "", http.StatusUnauthorized},
		{"wrong token", "/api/gateways", "Bearer nope", http.StatusUnauthorized},
		{"not bearer", "/api/gateways", "Basic " + testToken, http.StatusUnauthorized},
		{"token in query only for the stream", "/api/gateways?token=" + testToken, "", http.StatusUnauthorized},
		{"stream with wrong query token", "/api/stream?token=nope", "", http.StatusUnauthorized},
		{"good token", "/api/gateways", "Bearer " + testToken, http.StatusOK},
		{"health needs no token", "/healthz", "", http.StatusOK},
		{"readiness needs no token", "/readyz", "", http.StatusOK},
		{"dashboard needs no token", "/", "", http.StatusOK},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodGet, e.http.URL+tc.path, nil)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			res, err := e.http.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = res.Body.Close() }() // read-only: a close error tells the test nothing
			if res.StatusCode != tc.want {
				t.Fatalf("status %d, want %d", res.StatusCode, tc.want)
			}
			if tc.want == http.StatusUnauthorized {
				var body apiError
				decodeJSON(t, res, &body)
				if body.Error.Code != "unauthorized" || body.Error.Message == "" {
					t.Fatalf("error body %+v", body)
				}
			}
		})
	}
}

func TestAPIErrors(t *testing.T) {
	e := newEnv(t, "gw", "idle")
	g := newGateway(t, e.broker.URL(), "gw")
	g.online(t)
	g.send(t, running(1, "m1", 1))
	g.waitAck(t, 1)
	cases := []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"unknown gateway mission", "GET", "/api/gateways/nope/missions/m1", "", 404, "unknown_gateway"},
		{"unknown mission", "GET", "/api/gateways/gw/missions/nope", "", 404, "not_found"},
		{"unknown endpoint", "GET", "/api/nope", "", 404, "not_found"},
		{"wrong method", "GET", "/api/gateways/gw/control", "", 405, "method_not_allowed"},
		{"post to a list", "POST", "/api/missions", "{}", 405, "method_not_allowed"},
		{"bad json", "POST", "/api/gateways/gw/control", "{", 400, "invalid_json"},
		{"unknown field", "POST", "/api/gateways/gw/control", `{"action":"cancel","mission_id":"m1","x":1}`, 400, "invalid_json"},
		{"trailing data", "POST", "/api/gateways/gw/control", `{"action":"cancel","mission_id":"m1"} {}`, 400, "invalid_json"},
		{"bad action", "POST", "/api/gateways/gw/control", `{"action":"explode","mission_id":"m1"}`, 400, "invalid_action"},
		{"cancel without mission", "POST", "/api/gateways/gw/control", `{"action":"cancel"}`, 400, "invalid_request"},
		{"trigger without scene", "POST", "/api/gateways/gw/control", `{"action":"trigger"}`, 400, "invalid_request"},
		{"bad mission id", "POST", "/api/gateways/gw/control", `{"action":"cancel","mission_id":"a/b"}`, 400, "invalid_request"},
		{"control unknown gateway", "POST", "/api/gateways/nope/control", `{"action":"cancel","mission_id":"m1"}`, 404, "unknown_gateway"},
		{"control offline gateway", "POST", "/api/gateways/idle/control", `{"action":"cancel","mission_id":"m1"}`, 503, "gateway_offline"},
		{"body too large", "POST", "/api/gateways/gw/control", `{"action":"trigger","scene":"s","params":{"p":"` + strings.Repeat("x", MaxBody) + `"}}`, 413, "body_too_large"},
		{"bad state", "GET", "/api/missions?state=NAPPING", "", 400, "invalid_request"},
		{"bad limit", "GET", "/api/missions?limit=0", "", 400, "invalid_request"},
		{"huge limit", "GET", "/api/missions?limit=100000", "", 400, "invalid_request"},
		{"bad since", "GET", "/api/missions?since=yesterday", "", 400, "invalid_request"},
		{"bad cursor", "GET", "/api/missions?cursor=!!", "", 400, "invalid_request"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var body apiError
			if got := e.do(t, tc.method, tc.path, tc.body, &body); got != tc.status {
				t.Errorf("status %d, want %d (%+v)", got, tc.status, body)
			}
			if body.Error.Code != tc.code || body.Error.Message == "" {
				t.Errorf("error %+v, want code %q with a message", body.Error, tc.code)
			}
		})
	}
}

func TestAPIReads(t *testing.T) {
	e := newEnv(t, "gw")
	g := newGateway(t, e.broker.URL(), "gw")
	g.online(t)
	g.publish(t, g.topics.Heartbeat("gw"), false, uplink.Heartbeat{Gateway: "gw", Version: "9", Backlog: 4, Devices: []uplink.DeviceState{{ID: "lamp", Type: "light", Online: true}}})
	g.send(t, running(1, "m1", 1), running(2, "m1", 2), entry(3, "m2", 1, driver.StateSucceeded))
	g.waitAck(t, 3)

	var gws struct{ Gateways []Gateway }
	if s := e.do(t, "GET", "/api/gateways", "", &gws); s != 200 {
		t.Fatalf("status %d", s)
	}
	if len(gws.Gateways) != 1 || gws.Gateways[0].State != StateOnline || gws.Gateways[0].Heartbeat == nil ||
		gws.Gateways[0].Heartbeat.Backlog != 4 || len(gws.Gateways[0].Heartbeat.Devices) != 1 || gws.Gateways[0].Acked != 3 {
		t.Fatalf("gateways = %+v", gws.Gateways)
	}
	var page struct {
		Missions   []Mission
		NextCursor string `json:"next_cursor"`
	}
	if s := e.do(t, "GET", "/api/missions?gateway=gw&limit=1", "", &page); s != 200 || len(page.Missions) != 1 || page.NextCursor == "" {
		t.Fatalf("page 1: status %d %+v", s, page)
	}
	first := page.Missions[0].ID
	if s := e.do(t, "GET", "/api/missions?gateway=gw&limit=1&cursor="+page.NextCursor, "", &page); s != 200 || len(page.Missions) != 1 || page.Missions[0].ID == first {
		t.Fatalf("page 2: status %d %+v", s, page)
	}
	if s := e.do(t, "GET", "/api/missions?state=succeeded", "", &page); s != 200 || len(page.Missions) != 1 || page.Missions[0].ID != "m2" {
		t.Fatalf("by state: status %d %+v", s, page)
	}
	var recent struct {
		Missions []json.RawMessage `json:"missions"`
	}
	if s := e.do(t, "GET", "/api/missions?since=1h", "", &recent); s != 200 || len(recent.Missions) == 0 {
		t.Fatalf("since=1h: status %d, %d missions", s, len(recent.Missions))
	}
	since := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if s := e.do(t, "GET", "/api/missions?since="+since, "", &page); s != 200 || len(page.Missions) != 0 {
		t.Fatalf("since future: status %d %+v", s, page)
	}
	var d Detail
	if s := e.do(t, "GET", "/api/gateways/gw/missions/m1", "", &d); s != 200 {
		t.Fatalf("detail status %d", s)
	}
	if d.Seq != 2 || len(d.Timeline) != 2 || len(d.Steps) != 2 || d.Summary.State != driver.StateRunning {
		t.Fatalf("detail = %+v", d)
	}
	var h map[string]any
	if s := e.do(t, "GET", "/healthz", "", &h); s != 200 || h["status"] != "ok" {
		t.Fatalf("healthz %d %v", s, h)
	}
}

// TestEndToEnd drives the hub with a fake gateway: a batch is stored and
// acknowledged and streamed over SSE; a control request goes out and
// its result comes back through the API.
func TestEndToEnd(t *testing.T) {
	e := newEnv(t, "home")
	g := newGateway(t, e.broker.URL(), "home")
	g.online(t)
	e.waitOnline(t, "home")

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", e.http.URL+"/api/stream?token="+testToken, nil)
	res, err := e.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = res.Body.Close() }() // read-only: a close error tells the test nothing
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	events := make(chan string, 64)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(res.Body)
		var ev string
		for sc.Scan() {
			line := sc.Text()
			if name, ok := strings.CutPrefix(line, "event: "); ok {
				ev = name
			} else if data, ok := strings.CutPrefix(line, "data: "); ok {
				events <- ev + " " + data
			}
		}
	}()
	nextEvent := func(prefix string) string {
		t.Helper()
		for {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatalf("stream ended waiting for %q", prefix)
				}
				if strings.HasPrefix(ev, prefix) {
					return ev
				}
			case <-ctx.Done():
				t.Fatalf("no %q event", prefix)
			}
		}
	}
	nextEvent("hello")

	g.send(t, running(1, "m-e2e", 1), running(2, "m-e2e", 2))
	g.waitAck(t, 2)
	if ev := nextEvent("mission"); !strings.Contains(ev, `"id":"m-e2e"`) {
		t.Fatalf("mission event %s", ev)
	}
	g.send(t, running(1, "m-e2e", 1)) // re-delivery: acked again, nothing changes
	g.waitAck(t, 1)

	type reply struct {
		status int
		res    uplink.ControlResult
		err    error
	}
	replies := make(chan reply, 1)
	go func() {
		var r reply
		status, body, err := e.request("POST", "/api/gateways/home/control", `{"action":"cancel","mission_id":"m-e2e"}`)
		if err == nil {
			err = json.Unmarshal(body, &r.res)
		}
		r.status, r.err = status, err
		replies <- r
	}()
	c := g.waitControl(t)
	if c.Action != uplink.ActionCancel || c.MissionID != "m-e2e" || c.ID == "" {
		t.Fatalf("control = %+v", c)
	}
	g.publish(t, g.topics.ControlResult("home"), false, uplink.ControlResult{ID: "someone-else", OK: false})
	g.publish(t, g.topics.ControlResult("home"), false, uplink.ControlResult{ID: c.ID, OK: true, MissionID: "m-e2e", State: driver.StateCancelled})
	r := <-replies
	if r.err != nil || r.status != 200 || r.res.ID != c.ID || !r.res.OK || r.res.MissionID != "m-e2e" {
		t.Fatalf("control reply %+v", r)
	}

	d, err := e.st.Mission(t.Context(), "home", "m-e2e")
	if err != nil || d.Events != 2 || len(d.Gaps) != 0 {
		t.Fatalf("stored mission %+v (%v)", d, err)
	}
	gw, _ := e.st.Gateway(t.Context(), "home")
	if gw.Duplicates != 1 || gw.Events != 2 {
		t.Fatalf("gateway counters %+v", gw)
	}

}
