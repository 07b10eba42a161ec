package hub

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/clustertest"
	"github.com/sortie-edge/sortie/uplink"
)

// TestDashboard drives the real dashboard in headless Chromium over the
// DevTools protocol: the page loads with ?token=, shows a mission that
// a gateway publishes after the load, opens it, and its Cancel and Run
// scene buttons reach the gateway as control requests. It also checks
// that the page loads nothing from anywhere but the hub.
func TestDashboard(t *testing.T) {
	bin := needChromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	e := newEnv(t, "home")
	g := newGateway(t, e.broker.URL(), "home")
	g.online(t)
	e.waitOnline(t, "home")
	g.send(t, running(1, "m-old", 1))
	g.waitAck(t, 1)

	page := openDashboard(t, ctx, bin, e.http.URL+"/?token="+testToken)
	page.waitFor(t, ctx, `document.querySelector('#missions tr[data-mission="m-old"]') !== null`)
	page.waitFor(t, ctx, `!location.search.includes("token") && localStorage.getItem("sortie-hub-token") === "`+testToken+`"`)
	page.waitFor(t, ctx, `document.querySelector('.gw[data-gateway="home"] .badge.online') !== null`)

	// A mission published after the page loaded appears without reload.
	live := running(2, "m-live", 1)
	live.Event.Input = driver.InBeginStep
	live.Event.Step, live.Event.StepID, live.Event.Attempt = 0, "lights", 1
	g.send(t, live)
	page.waitFor(t, ctx, `(() => { const r = document.querySelector('#missions tr[data-mission="m-live"]'); return r !== null && r.dataset.state === "RUNNING"; })()`)

	// Open it: the timeline and steps show.
	page.eval(t, ctx, `document.querySelector('#missions tr[data-mission="m-live"]').click()`)
	page.waitFor(t, ctx, `!document.querySelector("#detail-panel").hidden && document.querySelector("#d-title").textContent.includes("m-live") && document.querySelectorAll("#d-timeline tbody tr").length === 1 && document.querySelector("#d-steps tbody").textContent.includes("lights")`)

	// Cancel reaches the gateway; its answer reaches the page.
	page.eval(t, ctx, `document.querySelector('.controls button[data-action="cancel"]').click()`)
	c := g.waitControl(t)
	if c.Action != uplink.ActionCancel || c.MissionID != "m-live" {
		t.Fatalf("control = %+v, want cancel of m-live", c)
	}
	g.publish(t, g.topics.ControlResult("home"), false, uplink.ControlResult{ID: c.ID, OK: true, MissionID: "m-live", State: driver.StateCancelled})
	page.waitFor(t, ctx, `document.querySelector("#control-result").textContent.includes("cancel ok")`)

	// The gateway's events for the cancel update the open mission live.
	done := entry(3, "m-live", 2, driver.StateCancelled)
	done.Mission.Created = live.Mission.Created
	g.send(t, done)
	page.waitFor(t, ctx, `document.querySelector('#missions tr[data-mission="m-live"]').dataset.state === "CANCELLED" && document.querySelectorAll("#d-timeline tbody tr").length === 2`)

	// Run scene from the gateway card.
	page.eval(t, ctx, `(() => { const f = document.querySelector('.gw[data-gateway="home"] form'); f.querySelector("input").value = "go_home"; f.querySelector("button").click(); })()`)
	c = g.waitControl(t)
	if c.Action != uplink.ActionTrigger || c.Scene != "go_home" || c.RequestID == "" {
		t.Fatalf("control = %+v, want trigger of go_home with a request id", c)
	}
	g.publish(t, g.topics.ControlResult("home"), false, uplink.ControlResult{ID: c.ID, OK: true, MissionID: "m-new", State: driver.StatePending})
	page.waitFor(t, ctx, `document.querySelector("#control-result").textContent.includes("trigger go_home ok")`)

	for _, u := range page.requests() {
		if !strings.HasPrefix(u, e.http.URL+"/") && !strings.HasPrefix(u, "data:") {
			t.Errorf("the dashboard loaded %s, which is not served by the hub", u)
		}
	}
}

// needChromium returns the browser's path, or skips (fails in CI).
func needChromium(t testing.TB) string {
	t.Helper()
	return clustertest.Need(t, "chromium", findChromium(), "chromium")
}

// openDashboard starts Chromium on url and waits for the page to be
// loaded and live.
func openDashboard(t *testing.T, ctx context.Context, bin, url string) *cdpPage {
	t.Helper()
	page := startChromium(t, ctx, bin)
	page.open(t, ctx, url)
	return page
}

// open loads url in the page and waits for it to be loaded and live.
func (p *cdpPage) open(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	for _, m := range []string{"Network.enable", "Page.enable"} {
		if err := p.call(ctx, m, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.call(ctx, "Page.navigate", map[string]string{"url": url}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.loaded:
	case <-ctx.Done():
		t.Fatal("the dashboard did not load")
	}
	p.waitFor(t, ctx, `document.querySelector("#live") && document.querySelector("#live").textContent === "live"`)
}

func findChromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// cdpPage is a DevTools protocol session with one page.
type cdpPage struct {
	ws     *websocket.Conn
	wmu    sync.Mutex
	nextID atomic.Int64

	mu      sync.Mutex
	pending map[int64]chan cdpMessage
	urls    []string
	err     error
	// loaded is signalled by Page.loadEventFired.
	loaded chan struct{}
	// onEvent, when set (before the first call), sees every event, on
	// the reading goroutine with mu held.
	onEvent func(method string, params json.RawMessage)
}

type cdpMessage struct {
	ID     int64           `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *struct {
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// startChromium launches headless Chromium and connects to its first
// page. Everything is torn down in the test's cleanup; on failure the
// browser's output is logged.
func startChromium(t testing.TB, ctx context.Context, bin string) *cdpPage {
	t.Helper()
	dir := t.TempDir()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
		"--user-data-dir="+dir, "--remote-debugging-port=0", "about:blank")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("chromium output:\n%s", out.String())
		}
	})
	// Chromium writes the port it picked to DevToolsActivePort; there is
	// no event to wait on, so check the file until it appears.
	var port string
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for port == "" {
		if b, err := os.ReadFile(filepath.Join(dir, "DevToolsActivePort")); err == nil {
			if line, _, _ := strings.Cut(string(b), "\n"); line != "" {
				port = line
			}
		}
		select {
		case <-tick.C:
		case <-exited:
			t.Fatalf("chromium exited early:\n%s", out.String())
		case <-ctx.Done():
			t.Fatal("chromium did not report its DevTools port")
		}
	}
	if _, err := strconv.Atoi(port); err != nil {
		t.Fatalf("DevToolsActivePort: %q", port)
	}
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://127.0.0.1:"+port+"/json/list", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("devtools targets: %v", err)
	}
	var targets []struct{ Type, WebSocketDebuggerURL string }
	err = json.NewDecoder(res.Body).Decode(&targets)
	_ = res.Body.Close() // read-only: the decode error is the one that matters
	if err != nil {
		t.Fatalf("devtools targets: %v", err)
	}
	wsURL := ""
	for _, tg := range targets {
		if tg.Type == "page" {
			wsURL = tg.WebSocketDebuggerURL
			break
		}
	}
	if wsURL == "" {
		t.Fatalf("no page target in %+v", targets)
	}
	ws, _, err := websocket.DefaultDialer.DialContext(ctx, wsURL, nil)
	if err != nil {
		t.Fatalf("devtools websocket: %v", err)
	}
	p := &cdpPage{ws: ws, pending: map[int64]chan cdpMessage{}, loaded: make(chan struct{}, 1)}
	readDone := make(chan struct{})
	go p.read(readDone)
	t.Cleanup(func() { _ = ws.Close(); <-readDone })
	return p
}

func (p *cdpPage) read(done chan struct{}) {
	defer close(done)
	for {
		var m cdpMessage
		if err := p.ws.ReadJSON(&m); err != nil {
			p.mu.Lock()
			p.err = err
			for id, ch := range p.pending {
				close(ch)
				delete(p.pending, id)
			}
			p.mu.Unlock()
			return
		}
		p.mu.Lock()
		if m.ID == 0 && p.onEvent != nil {
			p.onEvent(m.Method, m.Params)
		}
		if m.ID != 0 {
			if ch := p.pending[m.ID]; ch != nil {
				ch <- m
				delete(p.pending, m.ID)
			}
		} else if m.Method == "Page.loadEventFired" {
			select {
			case p.loaded <- struct{}{}:
			default:
			}
		} else if m.Method == "Network.requestWillBeSent" {
			var ev struct{ Request struct{ URL string } }
			if json.Unmarshal(m.Params, &ev) == nil {
				p.urls = append(p.urls, ev.Request.URL)
			}
		}
		p.mu.Unlock()
	}
}

func (p *cdpPage) requests() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.urls...)
}

func (p *cdpPage) call(ctx context.Context, method string, params, out any) error {
	id := p.nextID.Add(1)
	ch := make(chan cdpMessage, 1)
	p.mu.Lock()
	if p.err != nil {
		p.mu.Unlock()
		return p.err
	}
	p.pending[id] = ch
	p.mu.Unlock()
	msg := map[string]any{"id": id, "method": method}
	if params != nil {
		msg["params"] = params
	}
	p.wmu.Lock()
	err := p.ws.WriteJSON(msg)
	p.wmu.Unlock()
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	select {
	case m, ok := <-ch:
		if !ok {
			return fmt.Errorf("%s: devtools connection closed", method)
		}
		if m.Error != nil {
			return fmt.Errorf("%s: %s", method, m.Error.Message)
		}
		if out != nil {
			return json.Unmarshal(m.Result, out)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", method, ctx.Err())
	}
}

// evaluate runs JS in the page, awaiting a promise, and returns its
// value as JSON.
func (p *cdpPage) evaluate(ctx context.Context, expr string) (json.RawMessage, error) {
	var res struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		Exception *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	err := p.call(ctx, "Runtime.evaluate", map[string]any{"expression": expr, "awaitPromise": true, "returnByValue": true}, &res)
	if err != nil {
		return nil, err
	}
	if res.Exception != nil {
		return nil, errors.New(res.Exception.Text + " " + res.Exception.Exception.Description)
	}
	return res.Result.Value, nil
}

func (p *cdpPage) eval(t *testing.T, ctx context.Context, expr string) {
	t.Helper()
	if _, err := p.evaluate(ctx, expr); err != nil {
		t.Fatalf("eval %s: %v", expr, err)
	}
}

// waitFor waits, inside the page, until cond is true: the page checks
// it on every DOM change (a MutationObserver), bounded by 15 s.
func (p *cdpPage) waitFor(t *testing.T, ctx context.Context, cond string) {
	t.Helper()
	expr := `new Promise((resolve, reject) => {
	  const ok = () => { try { return !!(` + cond + `); } catch (_) { return false; } };
	  if (ok()) { resolve(true); return; }
	  const obs = new MutationObserver(() => { if (ok()) { obs.disconnect(); clearTimeout(timer); resolve(true); } });
	  obs.observe(document, { subtree: true, childList: true, attributes: true, characterData: true });
	  const timer = setTimeout(() => { obs.disconnect(); ok() ? resolve(true) : reject(new Error("timed out")); }, 15000);
	})`
	if _, err := p.evaluate(ctx, expr); err != nil {
		html, _ := p.evaluate(ctx, "document.body ? document.body.innerText : ''")
		t.Fatalf("waiting for %s: %v\npage text: %s", cond, err, html)
	}
}
