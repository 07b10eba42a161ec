package hub

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/internal/clustertest"
)

// loadPage is one page of the dashboard that BenchmarkDashboardLoad
// opens. Adding a page to the measure is one line in loadPages.
type loadPage struct {
	name string
	// path follows the hub's URL; {rollout}, {big_gw} and {big} are the
	// fill's (loadFill).
	path string
	// picture is a CSS selector: its first match is the first picture.
	picture string
	// ready is a JS expression, true once the page shows what it is
	// for; {gateways} is the fill's count.
	ready string
	// then, when set, is JS run once the page is loaded and idle; the
	// measure is then of what follows it (a range picked).
	then string
}

// loadPages are the measured pages. The dashboard is one page whose
// panels load together: the overview, the gateways and the missions are
// its load, seen at the moment each panel is drawn.
var loadPages = []loadPage{
	{name: "overview", path: "/", picture: "#o-chart svg", ready: `document.querySelector("#o-chart svg") && document.querySelectorAll("#missions tbody tr").length > 0 && document.querySelectorAll(".gw").length > 0`},
	{name: "fleet-at-a-glance", path: "/", picture: "#fl-states svg", ready: `document.querySelector("#fl-states svg") && document.querySelector("#fl-worst-gateway .body").children.length > 0`},
	{name: "gateways", path: "/", picture: ".gw", ready: `document.querySelectorAll(".gw").length >= Math.min(50, {gateways})`},
	{name: "missions", path: "/", picture: "#missions tbody tr", ready: `document.querySelectorAll("#missions tbody tr").length >= Math.min(100, {missions})`},
	{name: "mission-500-steps", path: "/#/gateways/{big_gw}/missions/{big}", picture: "#d-waterfall svg", ready: `document.querySelectorAll("#d-waterfall g.bar").length === 500 && document.querySelectorAll("#d-timeline tbody tr").length > 0`},
	{name: "outcomes-24h", path: "/", picture: `#o-chart svg[aria-label$="24h"]`, ready: `document.querySelector('#o-chart svg[aria-label$="24h"]')`},
	{name: "outcomes-7d", path: "/", picture: `#o-chart svg[aria-label$="7d"]`, ready: `document.querySelector('#o-chart svg[aria-label$="7d"]')`, then: pickRange("7d")},
	{name: "outcomes-30d", path: "/", picture: `#o-chart svg[aria-label$="30d"]`, ready: `document.querySelector('#o-chart svg[aria-label$="30d"]')`, then: pickRange("30d")},
	{name: "rollout", path: "/#/rollouts/{rollout}", picture: "#r-stages svg", ready: `document.querySelectorAll("#r-gateways tbody tr").length > 0 && document.querySelector("#r-stages svg")`},
}

func pickRange(r string) string {
	return `(() => { const s = document.querySelector("#o-range"); s.value = "` + r + `"; s.dispatchEvent(new Event("change")); })()`
}

// loadScale is the fill of BenchmarkDashboardLoad: SORTIE_LOAD_GATEWAYS
// (default 10,000) and SORTIE_LOAD_MISSIONS (default 1,000,000, the
// issue's), SORTIE_LOAD_REPEATS loads of each page (default 3), and
// SORTIE_LOAD_LIMIT seconds a page is given to be ready (default 60): a
// page that is not is counted (not-ready) and its figures are the limit.
func loadScale(b *testing.B) (gws, missions, repeats int, limit time.Duration) {
	get := func(name string, def int) int {
		v := os.Getenv(name)
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("%s=%q", name, v)
		}
		return n
	}
	return get("SORTIE_LOAD_GATEWAYS", 10000), get("SORTIE_LOAD_MISSIONS", 1000000), get("SORTIE_LOAD_REPEATS", 3),
		time.Duration(get("SORTIE_LOAD_LIMIT", 60)) * time.Second
}

// BenchmarkDashboardLoad loads each dashboard page (loadPages) in
// headless Chromium from a hub whose store holds a fleet's month
// (fillLoad: 10,000 gateways, 1,000,000 missions), on bbolt and on
// PostgreSQL, each page in a fresh browser with its cache off, and
// reports per page the median of the loads:
//
//	first-picture-ms  navigation start to the page's first picture
//	ready-ms          ... to the page showing everything it is for
//	idle-ms           ... to the last DOM change, long task or response
//	                  before 500 ms of quiet with nothing in flight
//	longest-task-ms   the longest main-thread task (a freeze)
//	longest-task-cpu-ms  the CPU time of the task that took most of it
//	                  (traced): what the page costs, which the machine's
//	                  load hardly changes (the trace slows the page a
//	                  little: its other figures are of a traced load)
//	KB                bytes received (Network encodedDataLength,
//	                  headers included; the event stream's so far)
//	requests          requests made
//	x-empty           idle-ms ÷ the same page's from an empty hub (the
//	                  baseline, measured in the same run)
//
// The spread (min–max) of each figure is logged. The fill is cached
// (loadCacheDir) for 6 hours: the first run fills for minutes, the next
// ones copy or restore it. It also times GET /api/outcomes (the
// aggregate query) for each range, over HTTP and in the store alone.
func BenchmarkDashboardLoad(b *testing.B) {
	bin := needChromium(b)
	gws, missions, repeats, limit := loadScale(b)
	for _, store := range []string{"bolt", "pg"} {
		b.Run("store="+store, func(b *testing.B) {
			var open func(b *testing.B, gws, missions int) (Backing, loadFill)
			switch store {
			case "bolt":
				open = openBoltFill
			default:
				open = openPGFill
			}
			// The empty hub first: the baseline.
			est, efill := open(b, 0, 0)
			empty := map[string][]pageLoad{}
			eh := startLoadHub(b, est)
			for _, p := range loadPages {
				if p.path == "/" && p.then == "" && p.name != "overview" {
					continue
				}
				for range repeats {
					empty[p.name] = append(empty[p.name], measurePage(b, bin, eh, p, efill, limit))
				}
			}
			eh.stop()
			st, fill := open(b, gws, missions)
			b.Logf("%s: %d gateways, %d missions (filled in %v)", store, fill.Gateways, fill.Missions, fill.Took.Round(time.Second))
			h := startLoadHub(b, st)
			for _, p := range loadPages {
				b.Run("page="+p.name, func(b *testing.B) {
					var loads []pageLoad
					for b.Loop() {
						for range repeats {
							loads = append(loads, measurePage(b, bin, h, p, fill, limit))
						}
					}
					reportLoads(b, loads, empty[emptyOf(p)])
				})
			}
			b.Run("api=outcomes", func(b *testing.B) {
				for b.Loop() {
					timeOutcomes(b, h, st)
				}
			})
			b.Run("api=pages", func(b *testing.B) {
				for b.Loop() {
					timeReads(b, h, st, fill)
				}
			})
			h.stop()
		})
	}
}

// emptyOf is the page of the empty hub a page is compared with.
func emptyOf(p loadPage) string {
	if p.path == "/" && p.then == "" {
		return "overview"
	}
	return p.name
}

// openBoltFill opens a copy of the cached bbolt fill (filling it first
// if there is none).
func openBoltFill(b *testing.B, gws, missions int) (Backing, loadFill) {
	b.Helper()
	dst := filepath.Join(b.TempDir(), "hub.db")
	if gws == 0 {
		st, err := Open(dst, Options{NoSync: true})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = st.Close() })
		return st, fillEmpty()
	}
	dir := loadCacheDir(b)
	name := fmt.Sprintf("bolt-%d-%d-v%d", gws, missions, fillVersion)
	src := filepath.Join(dir, name+".db")
	fill, ok := cachedFill(dir, name)
	if !ok {
		_ = os.Remove(src) // a fill without its facts is an unfinished one
		st, err := Open(src, Options{NoSync: true})
		if err != nil {
			b.Fatal(err)
		}
		fill = fillLoad(b, st, gws, missions, time.Now())
		if err := st.Close(); err != nil {
			b.Fatal(err)
		}
		keepFill(b, dir, name, fill)
	}
	if err := copyFile(src, dst); err != nil {
		b.Fatal(err)
	}
	st, err := Open(dst, Options{NoSync: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	return st, fill
}

// openPGFill starts PostgreSQL and restores the cached fill into it
// (filling it first, and dumping it, if there is none).
func openPGFill(b *testing.B, gws, missions int) (Backing, loadFill) {
	b.Helper()
	pg := clustertest.StartPostgres(b, clustertest.PostgresOptions{})
	openIt := func() *PGStore {
		st, err := OpenPG(context.Background(), pg.DSN())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = st.Close() })
		return st
	}
	if gws == 0 {
		st := openIt()
		return st, fillEmpty()
	}
	dir := loadCacheDir(b)
	name := fmt.Sprintf("pg-%d-%d-v%d", gws, missions, fillVersion)
	dump := filepath.Join(dir, name+".dump")
	fill, ok := cachedFill(dir, name)
	if ok {
		if err := pg.Restore(pg.Database, dump); err != nil {
			b.Fatal(err)
		}
		st := openIt()
		// A restore leaves the planner no statistics (pg_restore's advice
		// is to ANALYZE after it); a database in service has them from
		// autovacuum, which would take minutes to get to every table.
		if _, err := st.pool.Exec(context.Background(), `ANALYZE`); err != nil {
			b.Fatal(err)
		}
		return st, fill
	}
	st := openIt()
	fill = fillLoad(b, st, gws, missions, time.Now())
	if err := pg.Dump(pg.Database, dump); err != nil {
		b.Fatal(err)
	}
	keepFill(b, dir, name, fill)
	if _, err := st.pool.Exec(context.Background(), `ANALYZE`); err != nil { // as after a restore
		b.Fatal(err)
	}
	return st, fill
}

// fillEmpty is an empty hub's facts: a rollout of nobody cannot start,
// so its rollout page is of an unknown ID.
func fillEmpty() loadFill {
	return loadFill{Now: time.Now(), BigGW: "none", Big: "none", Rollout: "none"}
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }() // read-only
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close() // the copy's error is the one to report
		return err
	}
	return out.Close()
}

// loadHub is a hub (Service, API) over a filled store, with what it
// served timed.
type loadHub struct {
	url  string
	stop func()

	mu     sync.Mutex
	served []served
}

// served is one API response as the hub sent it.
type served struct {
	path  string
	took  time.Duration
	bytes int
}

func (h *loadHub) take() []served {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.served
	h.served = nil
	return out
}

// countingWriter counts what a handler writes.
type countingWriter struct {
	http.ResponseWriter
	n int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.n += n
	return n, err
}

func (w *countingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// startLoadHub runs a hub over st: its broker, its service (gateways
// stay online as stored: nothing marks them silent during the measure)
// and its API.
func startLoadHub(b *testing.B, st Backing) *loadHub {
	b.Helper()
	br := testBroker(b)
	svc := NewService(st, ServiceOptions{Broker: br.URL(), ClientID: hubClientID, Username: hubUser, Password: hubPassword,
		OfflineAfter: 1000 * time.Hour})
	stop := runService(b, svc, time.Minute)
	api := NewAPI(svc, APIOptions{Token: testToken})
	h := &loadHub{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		cw := &countingWriter{ResponseWriter: w}
		api.ServeHTTP(cw, r)
		if r.URL.Path != "/api/stream" {
			h.mu.Lock()
			h.served = append(h.served, served{path: r.URL.Path + "?" + r.URL.RawQuery, took: time.Since(start), bytes: cw.n})
			h.mu.Unlock()
		}
	}))
	h.url = srv.URL
	h.stop = func() { api.Close(); srv.Close(); stop() }
	return h
}

// pageLoad is one load of a page.
type pageLoad struct {
	picture, ready, idle, longest float64 // ms
	longestCPU                    float64 // ms
	bytes, requests               int
	slowest                       served // the API response that took longest
	apiBytes                      int    // the API's response bodies
	late                          bool   // not ready within the limit
}

// loadProbe is set in every document before its scripts run: it notes
// when the picture first shows, the last DOM change (but the minute
// refreshes of relative times), and long tasks.
const loadProbe = `window.__load = { pic: -1, last: 0, longest: 0, sel: %s };
new MutationObserver((recs) => {
  const now = performance.now();
  if (recs.some((r) => { const e = r.target.nodeType === 1 ? r.target : r.target.parentElement; return !(e && e.dataset && e.dataset.time); })) __load.last = now;
  if (__load.pic < 0 && document.querySelector(__load.sel)) __load.pic = now;
}).observe(document, { subtree: true, childList: true, attributes: true, characterData: true });
new PerformanceObserver((l) => { for (const e of l.getEntries()) { __load.longest = Math.max(__load.longest, e.duration); __load.last = Math.max(__load.last, e.startTime + e.duration); } }).observe({ type: "longtask", buffered: true });`

// netLog sums what the browser received, from the Network domain.
type netLog struct {
	requests int
	inflight map[string]bool // requests not finished, the event stream's aside
	got      map[string]int  // encodedDataLength by request
	stream   map[string]bool // EventSource requests
}

func (n *netLog) event(method string, params json.RawMessage) {
	var ev struct {
		RequestID         string  `json:"requestId"`
		Type              string  `json:"type"`
		EncodedDataLength float64 `json:"encodedDataLength"`
		Request           struct {
			URL string `json:"url"`
		} `json:"request"`
	}
	if json.Unmarshal(params, &ev) != nil {
		return
	}
	switch method {
	case "Network.requestWillBeSent":
		if strings.HasPrefix(ev.Request.URL, "data:") {
			return
		}
		n.requests++
		if ev.Type == "EventSource" {
			n.stream[ev.RequestID] = true
		} else {
			n.inflight[ev.RequestID] = true
		}
	case "Network.dataReceived":
		n.got[ev.RequestID] += int(ev.EncodedDataLength)
	case "Network.loadingFinished":
		// The total, headers included, replaces the chunks.
		n.got[ev.RequestID] = int(ev.EncodedDataLength)
		delete(n.inflight, ev.RequestID)
	case "Network.loadingFailed":
		delete(n.inflight, ev.RequestID)
	}
}

func (n *netLog) bytes() int {
	t := 0
	for _, v := range n.got {
		t += v
	}
	return t
}

// measurePage loads p once in a fresh browser.
func measurePage(b *testing.B, bin string, h *loadHub, p loadPage, fill loadFill, limit time.Duration) pageLoad {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*limit+time.Minute)
	defer cancel()
	cctx, stopBrowser := context.WithCancel(ctx)
	defer stopBrowser()
	page := startChromium(b, cctx, bin)
	net := &netLog{inflight: map[string]bool{}, got: map[string]int{}, stream: map[string]bool{}}
	page.mu.Lock()
	page.onEvent = net.event
	page.mu.Unlock()
	sel, _ := json.Marshal(p.picture) // a string encodes
	for _, c := range []struct {
		m string
		p any
	}{
		{"Network.enable", nil}, {"Page.enable", nil}, {"Network.setCacheDisabled", map[string]any{"cacheDisabled": true}},
		{"Emulation.setDeviceMetricsOverride", map[string]any{"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": false}},
		{"Page.addScriptToEvaluateOnNewDocument", map[string]any{"source": fmt.Sprintf(loadProbe, sel)}},
	} {
		if err := page.call(ctx, c.m, c.p, nil); err != nil {
			b.Fatal(err)
		}
	}
	expand := strings.NewReplacer("{rollout}", fill.Rollout, "{big_gw}", fill.BigGW, "{big}", fill.Big,
		"{gateways}", strconv.Itoa(fill.Gateways), "{missions}", strconv.Itoa(fill.Missions))
	path := expand.Replace(p.path)
	url := h.url + "/?token=" + testToken
	if i := strings.Index(path, "#"); i >= 0 {
		url += path[i:]
	}
	ready := expand.Replace(p.ready)
	if fill.Gateways == 0 {
		ready = emptyReady(p)
	}
	h.take()
	trace, err := page.startTrace(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if err := page.call(ctx, "Page.navigate", map[string]string{"url": url}, nil); err != nil {
		b.Fatal(err)
	}
	from := 0.0
	if p.then != "" {
		if _, ok := waitPage(b, ctx, page, emptyReady(loadPages[0]), limit); !ok {
			return notReady(limit)
		}
		quiet(b, ctx, page, net)
		page.mu.Lock()
		net.requests = 0
		clear(net.got)
		page.mu.Unlock()
		h.take()
		raw, err := page.evaluate(ctx, `(() => { __load.pic = -1; const t = performance.now(); `+p.then+`; return t; })()`)
		if err != nil {
			b.Fatal(err)
		}
		if err := json.Unmarshal(raw, &from); err != nil {
			b.Fatal(err)
		}
	}
	readyAt, ok := waitPage(b, ctx, page, ready, limit)
	if !ok {
		l := notReady(limit)
		page.mu.Lock()
		l.bytes, l.requests = net.bytes(), net.requests
		page.mu.Unlock()
		return l
	}
	last := quiet(b, ctx, page, net)
	var probe struct{ Pic, Longest float64 }
	raw, err := page.evaluate(ctx, `({ pic: __load.pic, longest: __load.longest })`)
	if err == nil {
		err = json.Unmarshal(raw, &probe)
	}
	if err != nil {
		b.Fatal(err)
	}
	long, err := trace.stop(ctx)
	if err != nil {
		b.Fatal(err)
	}
	page.mu.Lock()
	l := pageLoad{picture: probe.Pic - from, ready: readyAt - from, idle: max(last, readyAt) - from, longest: probe.Longest,
		longestCPU: float64(long.CPU.Microseconds()) / 1000, bytes: net.bytes(), requests: net.requests}
	page.mu.Unlock()
	for _, s := range h.take() {
		if strings.HasPrefix(s.path, "/api/") {
			l.apiBytes += s.bytes
		}
		if s.took > l.slowest.took {
			l.slowest = s
		}
	}
	if fill.Gateways == 0 {
		l.picture = max(l.picture, 0) // an empty hub draws no chart of its own
	}
	return l
}

// notReady is a load that was not ready within limit: its times are
// the limit.
func notReady(limit time.Duration) pageLoad {
	ms := float64(limit.Milliseconds())
	return pageLoad{picture: ms, ready: ms, idle: ms, longest: ms, late: true}
}

// emptyReady is what an empty hub's page shows when loaded: the lists
// read (its panels say so) and the outcome chart drawn.
func emptyReady(p loadPage) string {
	switch {
	case strings.Contains(p.path, "rollouts"):
		return `document.querySelector("#r-result").textContent !== "" || document.querySelector("#notice").textContent !== "" || !document.querySelector("#rollout-panel").hidden`
	case strings.Contains(p.path, "missions"):
		return `document.querySelector("#notice").textContent !== "" || !document.querySelector("#detail-panel").hidden`
	}
	return `document.querySelector("#o-chart svg") && document.querySelector("#gw-count").textContent !== ""`
}

// waitPage waits up to limit for cond in the page and returns when it
// became true (ms since navigation start, the page's clock), or false.
func waitPage(b *testing.B, ctx context.Context, page *cdpPage, cond string, limit time.Duration) (float64, bool) {
	b.Helper()
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	expr := `new Promise((resolve, reject) => {
	  const ok = () => { try { return !!(` + cond + `); } catch (_) { return false; } };
	  if (ok()) { resolve(performance.now()); return; }
	  const obs = new MutationObserver(() => { if (ok()) { obs.disconnect(); clearTimeout(timer); resolve(performance.now()); } });
	  obs.observe(document, { subtree: true, childList: true, attributes: true, characterData: true });
	  const timer = setTimeout(() => { obs.disconnect(); reject(new Error("timed out")); }, ` + strconv.Itoa(int(limit.Milliseconds())) + `);
	})`
	for {
		raw, err := page.evaluate(ctx, expr)
		if err != nil && strings.Contains(err.Error(), "context was destroyed") {
			continue // the document was replaced (the navigation): ask the new one
		}
		if err != nil && (ctx.Err() != nil || strings.Contains(err.Error(), "timed out")) {
			return 0, false
		}
		if err != nil {
			text, _ := page.evaluate(ctx, "document.body ? document.body.innerText.slice(0, 2000) : ''")
			b.Fatalf("waiting for %s: %v\npage text: %s", cond, err, text)
		}
		var at float64
		if err := json.Unmarshal(raw, &at); err != nil {
			b.Fatal(err)
		}
		return at, true
	}
}

// quiet waits until the page has been quiet for 500 ms (no DOM change,
// no long task, nothing in flight but the event stream) and returns
// the time of its last activity (ms, the page's clock).
func quiet(b *testing.B, ctx context.Context, page *cdpPage, net *netLog) float64 {
	b.Helper()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		raw, err := page.evaluate(ctx, `[performance.now(), Math.max(__load.last, ...performance.getEntriesByType("resource").map((e) => e.responseEnd))]`)
		if err != nil {
			b.Fatal(err)
		}
		var at [2]float64
		if err := json.Unmarshal(raw, &at); err != nil {
			b.Fatal(err)
		}
		page.mu.Lock()
		busy := len(net.inflight)
		page.mu.Unlock()
		if busy == 0 && at[0]-at[1] >= 500 {
			return at[1]
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			b.Fatalf("the page is not quiet: %d requests in flight", busy)
		}
	}
}

// reportLoads reports the medians of loads and logs their spread.
func reportLoads(b *testing.B, loads, empty []pageLoad) {
	b.Helper()
	fig := func(f func(pageLoad) float64, ls []pageLoad) (med, lo, hi float64) {
		v := make([]float64, len(ls))
		for i, l := range ls {
			v[i] = f(l)
		}
		slices.Sort(v)
		if len(v) == 0 {
			return 0, 0, 0
		}
		return v[len(v)/2], v[0], v[len(v)-1]
	}
	figures := []struct {
		unit string
		f    func(pageLoad) float64
	}{
		{"first-picture-ms", func(l pageLoad) float64 { return l.picture }},
		{"ready-ms", func(l pageLoad) float64 { return l.ready }},
		{"idle-ms", func(l pageLoad) float64 { return l.idle }},
		{"longest-task-ms", func(l pageLoad) float64 { return l.longest }},
		{"longest-task-cpu-ms", func(l pageLoad) float64 { return l.longestCPU }},
		{"KB", func(l pageLoad) float64 { return float64(l.bytes) / 1000 }},
		{"requests", func(l pageLoad) float64 { return float64(l.requests) }},
	}
	var spread []string
	for _, x := range figures {
		med, lo, hi := fig(x.f, loads)
		b.ReportMetric(med, x.unit)
		spread = append(spread, fmt.Sprintf("%s %.0f–%.0f", x.unit, lo, hi))
	}
	late := 0
	for _, l := range loads {
		if l.late {
			late++
		}
	}
	b.ReportMetric(float64(late), "not-ready")
	idle, _, _ := fig(figures[2].f, loads)
	eidle, elo, ehi := fig(figures[2].f, empty)
	ekb, _, _ := fig(figures[5].f, empty)
	if eidle > 0 {
		b.ReportMetric(idle/eidle, "x-empty")
	}
	slow := loads[0].slowest
	for _, l := range loads {
		if l.slowest.took > slow.took {
			slow = l.slowest
		}
	}
	b.Logf("spread over %d loads: %s; API bodies %d B; slowest response %s %v %d B; empty hub: idle %.0f ms (%.0f–%.0f), %.0f KB; static assets %d B",
		len(loads), strings.Join(spread, ", "), loads[0].apiBytes, slow.path, slow.took.Round(time.Millisecond), slow.bytes, eidle, elo, ehi, ekb, staticBytes(b))
	b.ReportMetric(0, "ns/op")
}

// staticBytes is the size of the dashboard's files, raw.
func staticBytes(b *testing.B) int {
	n := 0
	err := fs.WalkDir(webFS, "web", func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err == nil {
			n += int(info.Size())
		}
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// timeOutcomes times the outcome aggregate for each range: GET
// /api/outcomes over HTTP (the JSON included), and BuildOutcomes on the
// store alone; the medians are reported, the spread logged.
func timeOutcomes(b *testing.B, h *loadHub, st Backing) {
	b.Helper()
	const n = 21
	for _, rng := range []string{"24h", "7d", "30d"} {
		var api, store []time.Duration
		for range n {
			req, _ := http.NewRequest("GET", h.url+"/api/outcomes?range="+rng, nil)
			req.Header.Set("Authorization", "Bearer "+testToken)
			start := time.Now()
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, res.Body) // timed to the last byte
			_ = res.Body.Close()
			api = append(api, time.Since(start))
			if res.StatusCode != http.StatusOK {
				b.Fatalf("GET /api/outcomes?range=%s: %s", rng, res.Status)
			}
			start = time.Now()
			if _, err := BuildOutcomes(context.Background(), st, "", "", rng, "", time.Now()); err != nil {
				b.Fatal(err)
			}
			store = append(store, time.Since(start))
		}
		slices.Sort(api)
		slices.Sort(store)
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		b.ReportMetric(ms(api[n/2]), "api-ms-"+rng)
		b.ReportMetric(ms(store[n/2]), "store-ms-"+rng)
		b.Logf("%s: api %.2f ms (%.2f–%.2f), store %.2f ms (%.2f–%.2f)", rng, ms(api[n/2]), ms(api[0]), ms(api[n-1]), ms(store[n/2]), ms(store[0]), ms(store[n-1]))
	}
	b.ReportMetric(0, "ns/op")
}

// loadReads are the API reads the pages make, timed on their own by
// timeReads: name, path (as loadPage's).
var loadReads = [][2]string{
	{"gateways", "/api/gateways"},
	{"gateways-50", "/api/gateways?limit=50"},
	{"backlog-50", "/api/gateways?state=backlog&limit=50"},
	{"overview", "/api/fleet/overview"},
	{"worst-gw-7d", "/api/fleet/worst?by=gateway&range=7d&limit=11"}, // not the page's 10: its first read is not cached
	{"missions", "/api/missions?limit=100"},
	{"rollouts", "/api/rollouts"},
	{"rollout", "/api/rollouts/{rollout}"},
	{"mission-500", "/api/gateways/{big_gw}/missions/{big}"},
}

// timeReads times each read the pages make (the median of 4 gzipped,
// to the last byte) and its size, plain and gzipped as a browser gets
// it; cold-ms is the first, plain, read (the overview and the worst
// ranking are cached for 5 and 30 s after it).
func timeReads(b *testing.B, h *loadHub, st Backing, fill loadFill) {
	b.Helper()
	// The overview's read of the store, which its cache hides, and the
	// baseline: every gateway's whole record, what it read before.
	for _, read := range []struct {
		name string
		f    func(context.Context) error
	}{
		{"briefs", func(ctx context.Context) error { _, err := st.GatewayBriefs(ctx); return err }},
		{"records", func(ctx context.Context) error { _, err := st.Gateways(ctx); return err }},
	} {
		var took []time.Duration
		for range 5 {
			start := time.Now()
			if err := read.f(context.Background()); err != nil {
				b.Fatal(err)
			}
			took = append(took, time.Since(start))
		}
		slices.Sort(took)
		b.ReportMetric(float64(took[2].Microseconds())/1000, "ms-store-"+read.name)
		b.Logf("every gateway's %s: %v (%v–%v)", read.name, took[2].Round(time.Microsecond), took[0].Round(time.Microsecond), took[4].Round(time.Microsecond))
	}
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	expand := strings.NewReplacer("{rollout}", fill.Rollout, "{big_gw}", fill.BigGW, "{big}", fill.Big)
	for _, r := range loadReads {
		var took []time.Duration
		var cold time.Duration
		size := map[string]int{}
		for i := range 5 {
			enc := ""
			if i > 0 {
				enc = "gzip"
			}
			req, _ := http.NewRequest("GET", h.url+expand.Replace(r[1]), nil)
			req.Header.Set("Authorization", "Bearer "+testToken)
			if enc != "" {
				req.Header.Set("Accept-Encoding", enc)
			}
			start := time.Now()
			res, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			n, err := io.Copy(io.Discard, res.Body)
			_ = res.Body.Close() // read to the end
			if err != nil || res.StatusCode != http.StatusOK {
				b.Fatalf("GET %s: %s %v", r[1], res.Status, err)
			}
			if enc != "" {
				took = append(took, time.Since(start))
			} else {
				cold = time.Since(start)
			}
			size[enc] = int(n)
		}
		slices.Sort(took)
		b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "ms-"+r[0])
		b.ReportMetric(float64(cold.Microseconds())/1000, "cold-ms-"+r[0])
		b.ReportMetric(float64(size[""])/1000, "KB-"+r[0])
		b.ReportMetric(float64(size["gzip"])/1000, "gzKB-"+r[0])
		b.Logf("GET %s: %v (%v–%v) gzipped, cold %v; %d B, %d B gzipped", r[1], took[len(took)/2].Round(time.Millisecond),
			took[0].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), cold.Round(time.Millisecond), size[""], size["gzip"])
	}
	b.ReportMetric(0, "ns/op")
}
