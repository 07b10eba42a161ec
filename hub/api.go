package hub

import (
	"bytes"
	"context"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/httpjson"
	"github.com/sortie-edge/sortie/uplink"
)

//go:embed web
var webFS embed.FS

// MaxBody bounds API request bodies.
const MaxBody = 64 << 10

// APIOptions configures NewAPI.
type APIOptions struct {
	// Token is the bearer token every /api/ request must carry. Empty
	// denies every API request.
	Token string
	// KeepAlive is the interval of SSE keep-alive comments; default 15s.
	KeepAlive time.Duration
	// Logger receives request errors; nil discards them.
	Logger *slog.Logger
}

// Reader is what the API reads: the single hub's bbolt Store, or the
// cluster mode's PostgreSQL store.
//
// Every call takes a context: its cancellation and deadline reach the
// database (PostgreSQL's query is cancelled; bbolt, which cannot cancel
// a transaction, checks it before starting and inside long scans).
type Reader interface {
	Gateways(ctx context.Context) ([]Gateway, error)
	// Gateway returns one gateway, or an error wrapping ErrNotFound.
	Gateway(ctx context.Context, id string) (Gateway, error)
	Missions(ctx context.Context, q Query) ([]Mission, string, error)
	Mission(ctx context.Context, gw, id string) (Detail, error)
	// GatewayBriefs returns every gateway's brief (briefs.go), by ID;
	// GatewaysByID the records of some, in the order asked.
	GatewayBriefs(ctx context.Context) ([]GatewayBrief, error)
	GatewaysByID(ctx context.Context, ids []string) ([]Gateway, error)
	// FailedSince counts, for each of gws, the missions that finished
	// FAILED at or after since.
	FailedSince(ctx context.Context, since time.Time, gws []string) (map[string]int, error)
	Trace(ctx context.Context, gw, requestID string) (Trace, error)
	// OutcomeHours returns one scope's outcome roll-up rows by hour
	// (hub/outcomes.go).
	OutcomeHours(ctx context.Context, scope string, from, to int64) (map[int64]OutcomeRow, error)
}

// Backing is a hub store: the single hub's bbolt Store, or the cluster
// mode's PGStore. Both keep the same rules (one applier); the tests run
// the same cases on both.
type Backing interface {
	Reader
	// Apply folds messages into the store in one transaction.
	Apply(ctx context.Context, in []Inbound) (Result, error)
	// Register makes configured gateways known before they report.
	Register(ctx context.Context, now time.Time, ids ...string) error
	// Prune removes finished missions and old trigger records.
	Prune(ctx context.Context, now time.Time, r Retention) (int, error)
	Close() error
}

// Backend is the messaging side the API drives: the single hub's
// Service, or a cluster replica.
type Backend interface {
	// Health and Readiness say whether the hub can do its work (see
	// Service.Health and Service.Readiness).
	Health(ctx context.Context) Health
	Readiness(ctx context.Context) Health
	// Control sends a request to a gateway and waits for its result.
	Control(ctx context.Context, gw string, c uplink.Control) (uplink.ControlResult, error)
	// Watch streams updates after each commit (see Service.Watch).
	Watch(buf int) (<-chan Update, func())
	// Refused counts a control request turned away before it was sent.
	Refused(action string, err error)
	// Metrics is the replica's /metrics.
	Metrics() http.Handler
	Now() time.Time
}

// API is the hub's HTTP handler: the JSON API under /api/, /healthz, /readyz and
// the dashboard at /.
type API struct {
	svc  Backend
	st   Reader
	opts APIOptions
	log  *slog.Logger
	mux  *http.ServeMux

	closeOnce sync.Once
	closed    chan struct{}
	// GET /api/fleet/worst and /api/fleet/overview (rank.go, glance.go)
	worst    ttlCache[Worst]
	overview ttlCache[FleetOverview]
	facts    ttlCache[map[string]gatewayFacts] // on a replica that does not drive rollouts
}

// NewAPI returns the handler for svc.
func NewAPI(svc *Service, opts APIOptions) *API { return NewAPIOn(svc, svc.Store(), opts) }

// NewAPIOn returns the handler for any backend and store (cluster mode).
func NewAPIOn(svc Backend, st Reader, opts APIOptions) *API {
	orDefault(&opts.KeepAlive, 15*time.Second)
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	a := &API{svc: svc, st: st, opts: opts, log: log, mux: http.NewServeMux(), closed: make(chan struct{}),
		worst: ttlCache[Worst]{ttl: 30 * time.Second}, overview: ttlCache[FleetOverview]{ttl: 5 * time.Second},
		facts: ttlCache[map[string]gatewayFacts]{ttl: 5 * time.Second}}
	a.mux.HandleFunc("/healthz", a.method(http.MethodGet, a.health(a.svc.Health)))
	a.mux.HandleFunc("/readyz", a.method(http.MethodGet, a.health(a.svc.Readiness)))
	// Open, as the agent's is: aggregates only, nothing a gateway or a
	// mission could be read from.
	a.mux.Handle("/metrics", a.method(http.MethodGet, svc.Metrics().ServeHTTP))
	a.mux.HandleFunc("/api/gateways", a.auth(a.method(http.MethodGet, a.gateways)))
	a.mux.HandleFunc("/api/missions", a.auth(a.method(http.MethodGet, a.missions)))
	a.mux.HandleFunc("/api/gateways/{gw}/missions/{id}", a.auth(a.method(http.MethodGet, a.mission)))
	a.mux.HandleFunc("/api/outcomes", a.auth(a.method(http.MethodGet, a.outcomes)))
	a.mux.HandleFunc("/api/gateways/{gw}/control", a.auth(a.method(http.MethodPost, a.control)))
	a.mux.HandleFunc("/api/gateways/{gw}/why/{request_id}", a.auth(a.method(http.MethodGet, a.why)))
	a.mux.HandleFunc("/api/stream", a.auth(a.method(http.MethodGet, a.stream)))
	a.fleetRoutes()
	a.glanceRoutes()
	a.mux.HandleFunc("/api/", a.auth(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "no such endpoint: "+r.URL.Path)
	}))
	static, _ := fs.Sub(webFS, "web")
	files := http.FileServerFS(static)
	a.mux.HandleFunc("/", a.method(http.MethodGet, func(w http.ResponseWriter, r *http.Request) {
		// Everything the dashboard loads comes from the hub itself.
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'")
		w.Header().Set("Referrer-Policy", "no-referrer") // the first URL may carry ?token=
		files.ServeHTTP(w, r)
	}))
	return a
}

// ServeHTTP serves the API and the dashboard.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if r.URL.Path == "/api/stream" {
		a.mux.ServeHTTP(w, r)
		return
	}
	withGzip(w, r, a.mux)
}

// Close ends open event streams, which would otherwise hold
// http.Server.Shutdown until its timeout; register it with
// RegisterOnShutdown.
func (a *API) Close() { a.closeOnce.Do(func() { close(a.closed) }) }

// apiError is the body of every error response.
type apiError = httpjson.Error

func writeError(w http.ResponseWriter, status int, code, msg string) {
	httpjson.WriteError(w, status, code, msg, false)
}

func writeJSON(w http.ResponseWriter, status int, v any) { httpjson.Write(w, status, v, false) }

// fail maps an error to a status and code.
func (a *API) fail(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the client hung up, and its query was cancelled: no one to answer
	}
	status, code := http.StatusInternalServerError, "internal"
	switch {
	case errors.Is(err, ErrUnknownGateway):
		status, code = http.StatusNotFound, "unknown_gateway"
	case errors.Is(err, ErrNotFound):
		status, code = http.StatusNotFound, "not_found"
	case errors.Is(err, ErrInvalid):
		status, code = http.StatusBadRequest, "invalid_request"
	case errors.Is(err, ErrOffline):
		status, code = http.StatusServiceUnavailable, "gateway_offline"
	case errors.Is(err, ErrNotConnected):
		status, code = http.StatusServiceUnavailable, "broker_unavailable"
	case errors.Is(err, ErrTimeout):
		status, code = http.StatusGatewayTimeout, "control_timeout"
	case errors.Is(err, ErrStoreUnavailable):
		status, code = http.StatusServiceUnavailable, "store_unavailable"
	case errors.Is(err, ErrNotLeader):
		status, code = http.StatusServiceUnavailable, "not_leader"
	}
	msg := err.Error()
	switch code {
	case "internal":
		a.log.Error("api request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		msg = "internal error"
	case "store_unavailable":
		a.log.Warn("api request failed: the database does not answer", "method", r.Method, "path", r.URL.Path, "err", err)
		msg = "the hub's database does not answer; try again shortly"
	}
	writeError(w, status, code, msg)
}

func (a *API) method(m string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if head := m == http.MethodGet && r.Method == http.MethodHead; r.Method != m && !head {
			w.Header().Set("Allow", m)
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" not allowed; use "+m)
			return
		}
		h(w, r)
	}
}

// auth checks the bearer token. EventSource cannot set headers, so the
// stream alone also takes the token as ?token=.
func (a *API) auth(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !a.authorized(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sortie-hub"`)
			writeError(w, http.StatusUnauthorized, "unauthorized", "missing or wrong bearer token")
			return
		}
		h(w, r)
	}
}

// authorized says whether r carries the API token.
func (a *API) authorized(r *http.Request) bool { return Authorized(r, a.opts.Token) }

// Authorized says whether r carries token, as the API takes it: a
// bearer token, or ?token= on /api/stream (EventSource sets no headers).
// An empty token authorizes nothing.
func Authorized(r *http.Request, token string) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok && r.URL.Path == "/api/stream" {
		got, ok = r.URL.Query().Get("token"), true
	}
	return ok && token != "" && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
}

// health answers with check: 200 when ok, else 503 with the reason.
// The message (an error naming hosts, users, databases) goes only to a
// request with the token: a probe needs the status, not the detail.
func (a *API) health(check func(context.Context) Health) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		h := check(r.Context())
		code := http.StatusOK
		if h.Status != "ok" {
			code = http.StatusServiceUnavailable
		}
		if !a.authorized(r) {
			h.Message = ""
		}
		writeJSON(w, code, h)
	}
}

// GatewayView is a gateway in GET /api/gateways: what the store knows,
// with the missions that failed in the last 24 hours (by when they
// finished), which the dashboard shows on the gateway's card, and what
// the rollout engine knows of it: its tags and its conditions
// (glance.go).
type GatewayView struct {
	Gateway
	Failed24h  int      `json:"failed_24h"`
	Tags       []string `json:"tags,omitempty"`
	Conditions []string `json:"conditions,omitempty"`
}

// parseQuery reads the filters of GET /api/missions.
func parseQuery(r *http.Request) (Query, error) {
	v := r.URL.Query()
	q := Query{Gateway: v.Get("gateway"), Scene: v.Get("scene"), Cursor: v.Get("cursor")}
	if s := v.Get("state"); s != "" {
		for st := range strings.SplitSeq(s, ",") {
			st := driver.State(strings.ToUpper(strings.TrimSpace(st)))
			if !st.Valid() {
				return q, fmt.Errorf("%w: unknown state %q", ErrInvalid, st)
			}
			q.States = append(q.States, st)
		}
	}
	for _, p := range []struct {
		name string
		dst  *time.Time
	}{{"since", &q.Since}, {"until", &q.Until}} {
		if s := v.Get(p.name); s != "" {
			t, err := time.Parse(time.RFC3339, s)
			if err != nil {
				// As the agent's API: a duration means "that long ago".
				d, derr := time.ParseDuration(s)
				if derr != nil || d < 0 {
					return q, fmt.Errorf("%w: %s must be RFC 3339 (2025-06-01T12:00:00Z) or a duration ago (2h)", ErrInvalid, p.name)
				}
				t = time.Now().Add(-d)
			}
			*p.dst = t
		}
	}
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxLimit {
			return q, fmt.Errorf("%w: limit must be 1..%d", ErrInvalid, MaxLimit)
		}
		q.Limit = n
	}
	return q, nil
}

func (a *API) missions(w http.ResponseWriter, r *http.Request) {
	q, err := parseQuery(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	ms, next, err := a.st.Missions(r.Context(), q)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if ms == nil {
		ms = []Mission{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"missions": ms, "next_cursor": next})
}

func (a *API) mission(w http.ResponseWriter, r *http.Request) {
	gw, id := r.PathValue("gw"), r.PathValue("id")
	if _, err := a.st.Gateway(r.Context(), gw); err != nil {
		a.fail(w, r, err)
		return
	}
	d, err := a.st.Mission(r.Context(), gw, id)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	withWaterfall(&d, time.Now())
	writeJSON(w, http.StatusOK, d)
}

// why answers what became of a trigger of a gateway, from the records
// the gateway synced.
func (a *API) why(w http.ResponseWriter, r *http.Request) {
	gw, id := r.PathValue("gw"), r.PathValue("request_id")
	if _, err := a.st.Gateway(r.Context(), gw); err != nil {
		a.fail(w, r, err)
		return
	}
	t, err := a.st.Trace(r.Context(), gw, id)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, t)
}

// ControlRequest is the body of POST /api/gateways/{gw}/control.
type ControlRequest struct {
	Action    string         `json:"action"`
	MissionID string         `json:"mission_id,omitempty"`
	Scene     string         `json:"scene,omitempty"`
	Params    map[string]any `json:"params,omitempty"`
	RequestID string         `json:"request_id,omitempty"`
}

func (a *API) control(w http.ResponseWriter, r *http.Request) {
	gw := r.PathValue("gw")
	g, err := a.st.Gateway(r.Context(), gw)
	switch {
	case errors.Is(err, ErrUnknownGateway):
		a.fail(w, r, err)
		return
	case err != nil:
		// The store is unreachable: the gateway may well be online, and
		// the control does not need the store.
		g = Gateway{ID: gw, State: uplink.StateOnline}
	}
	var req ControlRequest
	if status, code, err := decodeBody(w, r, &req); err != nil {
		writeError(w, status, code, err.Error())
		return
	}
	switch req.Action {
	case uplink.ActionTrigger, uplink.ActionPause, uplink.ActionResume, uplink.ActionCancel, uplink.ActionRetry:
	default:
		writeError(w, http.StatusBadRequest, "invalid_action", fmt.Sprintf("action %q: want trigger, pause, resume, cancel or retry", req.Action))
		return
	}
	// A control sent to an offline gateway would be lost (sessions are
	// clean) and the caller would wait out the timeout for nothing.
	if g.State != uplink.StateOnline {
		a.svc.Refused(req.Action, ErrOffline)
		why := ""
		if g.Why != "" {
			why = fmt.Sprintf(" (%s, since %s)", g.Why, g.Since.UTC().Format(time.RFC3339))
		}
		writeError(w, http.StatusServiceUnavailable, "gateway_offline", fmt.Sprintf("gateway %s is %s%s; try again when it is online", gw, g.State, why))
		return
	}
	res, err := a.svc.Control(r.Context(), gw, uplink.Control{
		Action: req.Action, MissionID: req.MissionID, Scene: req.Scene, Params: req.Params, RequestID: req.RequestID,
	})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// decodeBody reads one JSON object of at most MaxBody bytes with no
// unknown fields.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) (int, string, error) {
	// curl -d sends application/x-www-form-urlencoded by default; the body
	// is still parsed as JSON, so let that through as the agent's API does.
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") && !strings.HasPrefix(ct, "application/x-www-form-urlencoded") {
		return http.StatusUnsupportedMediaType, "unsupported_media_type", fmt.Errorf("content type %q: want application/json", ct)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return http.StatusRequestEntityTooLarge, "body_too_large", fmt.Errorf("body exceeds %d bytes", MaxBody)
		}
		return http.StatusBadRequest, "invalid_json", fmt.Errorf("read body: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return http.StatusBadRequest, "invalid_json", fmt.Errorf("decode body: %w", err)
	}
	if dec.More() {
		return http.StatusBadRequest, "invalid_json", errors.New("decode body: trailing data after the JSON object")
	}
	return 0, "", nil
}

// stream is the SSE feed: a "hello" event once subscribed (the client
// then loads the lists, so nothing falls between load and watch), then
// "gateway" and "mission" events as they are committed.
func (a *API) stream(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		writeError(w, http.StatusInternalServerError, "internal", "streaming unsupported")
		return
	}
	updates, stop := a.svc.Watch(256)
	defer stop()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	// A failed write means the browser has gone; it reconnects by itself.
	if _, err := fmt.Fprint(w, "retry: 2000\nevent: hello\ndata: {}\n\n"); err != nil {
		return
	}
	fl.Flush()
	keep := time.NewTicker(a.opts.KeepAlive)
	defer keep.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-a.closed:
			return
		case <-keep.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
		case u, ok := <-updates:
			if !ok {
				return // fell behind or stopping; the browser reconnects
			}
			var data []byte
			if u.Gateway != nil {
				data, _ = json.Marshal(u.Gateway)
			} else {
				data, _ = json.Marshal(u.Mission)
			}
			if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", u.Type, data); err != nil {
				return
			}
		}
		fl.Flush()
	}
}
