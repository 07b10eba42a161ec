package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/driver/waterfall"
	"github.com/sortie-edge/sortie/internal/httpjson"
	"github.com/sortie-edge/sortie/scenes"
	"github.com/sortie-edge/sortie/store"
)

// ErrOverloaded is what Options.Trigger returns (wrapped or not) when
// the trigger service cannot take a trigger now; the API answers 503
// with Retry-After.
var ErrOverloaded = errors.New("trigger queue is full")

// API limits.
const (
	// MaxBodySize bounds request bodies; triggers are smaller still
	// (scenes.MaxTriggerSize).
	MaxBodySize = 64 << 10
	// submitTimeout bounds how long a submit waits for the trigger
	// goroutine before it answers "overloaded".
	submitTimeout = 30 * time.Second
)

// Error codes of the API, in {"error":{"code":...}} (docs/api.md). Trigger rejections
// use the reply's reason (unknown_scene, invalid_param, already_running,
// ...) as their code.
const (
	CodeBadRequest       = "bad_request"
	CodeUnauthorized     = "unauthorized"
	CodeNotFound         = "not_found"
	CodeConflict         = "conflict"
	CodeTooLarge         = "too_large"
	CodeShuttingDown     = "shutting_down"
	CodeStarting         = "starting"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeInternal         = "internal"
)

// DeviceStatus is what the API reads about devices: the devices.Client.
type DeviceStatus interface {
	// Connected reports whether the devices connection is up.
	Connected() bool
	// Available reports whether a device is online.
	Available(deviceID string) bool
	// State returns the device's last reported state.
	State(deviceID string) (map[string]any, bool)
}

// Options are the parts of the agent the management API uses.
type Options struct {
	Log *slog.Logger
	// Token, when set, is required as "Authorization: Bearer <token>" on
	// /api/; health checks and metrics stay open.
	Token    string
	Driver   *driver.Driver
	Devices  DeviceStatus
	Registry *devices.Registry
	// Registries, when set, is the registry that runs now, for an agent
	// that swaps it (configuration bundles); Registry is then unused.
	Registries func() *devices.Registry
	Catalog    *scenes.Catalog
	// Trigger submits a decoded trigger through the agent's trigger
	// service (scene modes, request-ID idempotency) and returns its
	// reply; an error means the service did not answer in time.
	Trigger func(ctx context.Context, tr scenes.Trigger) (scenes.Reply, error)
	// Backup makes a consistent copy of the database in a temporary file
	// (store.DB.BackupFile), which is then sent.
	Backup func() (io.ReadCloser, int64, error)
	// Why answers for one request ID (driver.ErrNotFound when nothing is
	// recorded); RecentWhy lists the latest records, failed ones or the
	// others. Declined records a trigger the API refused before it reached
	// the trigger service (a body that does not decode as a trigger).
	Why       func(ctx context.Context, requestID string) (Why, error)
	RecentWhy func(ctx context.Context, failed bool, limit int) ([]Why, error)
	Declined  func(tr scenes.Trigger, rep scenes.Reply)
	// Schedules lists the scenes' schedules with their next n firings.
	Schedules func(n int) []ScheduleItem
	// Discover, when set, listens for window to what the device
	// ecosystems announce (devices.Client.Discover).
	Discover func(ctx context.Context, window time.Duration) (devices.Discovery, error)
	// WriteError, when set, says why the store's writes are failing (nil
	// when they are not): /readyz is then not ready, since a store that
	// reads but cannot write takes no trigger.
	WriteError func() error
	// Scenes, when set, returns the catalog that runs now (a bundle
	// applied replaces it); without it, Catalog is listed.
	Scenes func() *scenes.Catalog
	// Config and Apply, when set, show the configuration that runs and
	// take a configuration bundle's encoding (docs/fleet.md).
	Config func() ConfigInfo
	Apply  func(ctx context.Context, encoded []byte) (BundleOutcome, error)
	// ConfigProblem, when set, says why the configuration that runs is
	// not wholly in force (a device registry that could not be swapped
	// back): /readyz is then not ready.
	ConfigProblem func() error
	// Broker, when set, says why the agent's own link to an external
	// broker (its triggers, replies and events) is not up, nil when it
	// is: /readyz is then not ready.
	Broker func() error
}

// Handler is the management API, an http.Handler: JSON under /api/ and
// the health checks /healthz and /readyz. The agent mounts it next to
// /metrics. Safe for concurrent use.
type Handler struct {
	opts  Options
	token []byte
	mux   *http.ServeMux
	// stopped ends when the HTTP server begins shutting down: requests
	// still waiting then answer 503 instead of hanging.
	stopped  context.Context
	stop     context.CancelFunc
	stopping atomic.Bool
	// backingUp admits one backup at a time: each takes the database's
	// size in the data directory while it is sent.
	backingUp atomic.Bool
}

// New returns the API over the agent's parts in o.
func New(o Options) *Handler {
	s := &Handler{opts: o, token: []byte(o.Token), mux: http.NewServeMux()}
	s.Register(s.mux)
	s.stopped, s.stop = context.WithCancel(context.Background())
	return s
}

// ServeHTTP serves the API's routes.
func (s *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Shutdown marks the API as stopping, so that requests still waiting
// answer 503 instead of holding the server's shutdown; register it with
// http.Server.RegisterOnShutdown.
func (s *Handler) Shutdown() {
	s.stopping.Store(true)
	s.stop()
}

// Register adds the API's routes to mux: JSON under /api/, and the
// health checks /healthz and /readyz.
func (s *Handler) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	allowed := map[string][]string{}
	// A table, not a call per route: each inlined call cost the
	// gateway's binary hundreds of bytes.
	for _, r := range []struct {
		method, path string
		h            http.HandlerFunc
	}{
		{"GET", "/api/missions", s.listMissions},
		{"POST", "/api/missions", s.submit},
		{"GET", "/api/missions/{id}", s.getMission},
		{"POST", "/api/missions/{id}/priority", s.setPriority},
		{"POST", "/api/missions/{id}/{action}", s.control},
		{"GET", "/api/devices", s.listDevices},
		{"POST", "/api/devices/discover", s.discover},
		{"GET", "/api/scenes", s.listScenes},
		{"GET", "/api/backup", s.backup},
		{"GET", "/api/why", s.whyList},
		{"GET", "/api/why/{request_id}", s.why},
		{"GET", "/api/schedules", s.listSchedules},
		{"GET", "/api/config", s.config},
		{"POST", "/api/config/bundle", s.applyBundle},
	} {
		mux.Handle(r.method+" "+r.path, s.guard(r.h))
		allowed[r.path] = append(allowed[r.path], r.method)
	}
	// GET would answer HEAD too, by making a whole copy for nothing.
	mux.Handle("HEAD /api/backup", s.guard(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "GET")
		writeError(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed, "/api/backup takes GET, not HEAD")
	}))
	// Without these the mux would answer other methods and unknown paths
	// in plain text.
	for path, methods := range allowed {
		if path == "/api/missions/{id}/priority" {
			continue // covered by .../{action}
		}
		allow := strings.Join(methods, ", ")
		mux.Handle(path, s.guard(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			writeError(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed, fmt.Sprintf("%s takes %s, not %s", r.URL.Path, allow, r.Method))
		}))
	}
	mux.Handle("/api/", s.guard(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, CodeNotFound, fmt.Sprintf("no endpoint %s %s", r.Method, r.URL.Path))
	}))
	// The address the agent prints is opened in a browser: say what is
	// here rather than a bare 404. It names no mission and needs no token.
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, rootText)
	})
}

const rootText = `Sortie agent: its management API (docs/api.md).

  GET  /api/missions, /api/missions/{id}   missions (the CLI: agent missions)
  POST /api/missions                       trigger a scene (agent trigger)
  GET  /api/scenes, /api/devices, /api/why, /api/schedules, /api/config
  GET  /healthz, /readyz, /metrics         health and Prometheus metrics

/api/ takes the bearer token when the agent has one. The web dashboard
is the hub's (make demo-hub; docs/hub.md).
`

// guard checks the token, refuses work while shutting down and bounds
// the body. The token is compared in constant time and never logged.
func (s *Handler) guard(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(s.token) > 0 {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || subtle.ConstantTimeCompare([]byte(got), s.token) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="sortie-agent"`)
				msg := "missing bearer token"
				if ok {
					msg = "wrong bearer token"
				}
				s.opts.Log.Warn("api: unauthorized request", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "why", msg)
				writeError(w, http.StatusUnauthorized, CodeUnauthorized, msg)
				return
			}
		}
		if s.stopping.Load() {
			writeError(w, http.StatusServiceUnavailable, CodeShuttingDown, "the agent is shutting down")
			return
		}
		if r.URL.Path != "/api/config/bundle" { // a bundle has its own bound
			r.Body = http.MaxBytesReader(w, r.Body, MaxBodySize)
		}
		h(w, r)
	})
}

// readyz reports whether the agent can take and run missions: the store
// answers, the devices connection and the agent's link are up and the
// server is not stopping
// (the driver is started before the listener opens and stopped after
// it closes).
func (s *Handler) readyz(w http.ResponseWriter, r *http.Request) {
	var reasons []string
	if _, err := s.opts.Driver.Get(r.Context(), "readyz-probe"); err != nil && !errors.Is(err, driver.ErrNotFound) {
		reasons = append(reasons, "store: "+err.Error())
	}
	if s.opts.WriteError != nil {
		if err := s.opts.WriteError(); err != nil {
			reasons = append(reasons, "store: writes failing: "+err.Error())
		}
	}
	if !s.opts.Devices.Connected() {
		reasons = append(reasons, "devices: not connected to the broker")
	}
	if s.opts.Broker != nil {
		if err := s.opts.Broker(); err != nil {
			reasons = append(reasons, "broker: "+err.Error())
		}
	}
	if s.opts.ConfigProblem != nil {
		if err := s.opts.ConfigProblem(); err != nil {
			reasons = append(reasons, "config: "+err.Error())
		}
	}
	if s.stopping.Load() {
		reasons = append(reasons, "driver: shutting down")
	}
	if len(reasons) > 0 {
		writeJSON(w, http.StatusServiceUnavailable, Readiness{Status: "not_ready", Reasons: reasons})
		return
	}
	writeJSON(w, http.StatusOK, Readiness{Status: "ready"})
}

// Readiness is the body of /readyz.
type Readiness struct {
	Status  string   `json:"status"`
	Reasons []string `json:"reasons,omitempty"`
}

// MissionItem is one row of GET /api/missions: enough to list and pick
// a mission without its steps and context.
type MissionItem struct {
	ID        string         `json:"id"`
	Scene     string         `json:"scene"`
	State     driver.State   `json:"state"`
	Priority  int            `json:"priority"`
	Step      int            `json:"step"`             // current step index, from 0
	Steps     int            `json:"steps"`            // number of steps
	Done      int            `json:"done"`             // steps carried out (succeeded, undone since or not)
	Undone    int            `json:"undone,omitempty"` // completed steps compensated since
	Source    string         `json:"source,omitempty"`
	RequestID string         `json:"request_id,omitempty"`
	TraceID   string         `json:"trace_id"`
	Error     string         `json:"error,omitempty"`
	Reason    string         `json:"reason,omitempty"`
	Created   time.Time      `json:"created"`
	Started   time.Time      `json:"started,omitzero"`
	Updated   time.Time      `json:"updated"`
	Finished  time.Time      `json:"finished,omitzero"`
	Control   driver.Control `json:"control,omitzero"` // pause or cancel waiting for a step boundary
}

func ItemOf(m *driver.Mission) MissionItem {
	return MissionItem{
		ID: m.ID, Scene: m.Type, State: m.State, Priority: m.Priority, Step: m.Progress.Step, Steps: len(m.Steps),
		Source: m.Meta.Source, RequestID: m.Meta.RequestKey, TraceID: m.Meta.TraceID, Error: m.Error, Reason: m.Reason,
		Created: m.Meta.Created, Started: m.Meta.Started, Updated: m.Meta.Updated, Finished: m.Meta.Finished,
		Control: driver.Control{Pause: m.Control.Pause, Cancel: m.Control.Cancel},
		Undone:  m.StepsUndone(),
		Done:    m.StepsDone(),
	}
}

// MissionList is the body of GET /api/missions.
type MissionList struct {
	Missions []MissionItem `json:"missions"`
	// NextCursor, when set, is the cursor parameter of the next page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// MissionDetail is the body of GET /api/missions/{id}.
type MissionDetail struct {
	Mission  *driver.Mission `json:"mission"`
	Timeline []driver.Event  `json:"timeline"`
	// Waterfall is the timeline drawn as bars (see Waterfall); absent
	// from agents before it.
	Waterfall *waterfall.Chart `json:"waterfall,omitempty"`
}

// missionFilter reads the list query. since and until take RFC 3339
// times or durations meaning "that long ago".
func missionFilter(q map[string][]string, now time.Time) (driver.Filter, error) {
	var f driver.Filter
	for key := range q {
		switch key {
		case "state", "scene", "since", "until", "limit", "cursor":
		default:
			return f, fmt.Errorf("unknown parameter %q (want state, scene, since, until, limit or cursor)", key)
		}
	}
	for _, v := range q["state"] {
		for _, s := range strings.Split(v, ",") {
			st := driver.State(strings.ToUpper(strings.TrimSpace(s)))
			if !st.Valid() {
				return f, fmt.Errorf("state %q is not one of %v", s, driver.States)
			}
			f.States = append(f.States, st)
		}
	}
	get := func(key string) string {
		if v := q[key]; len(v) > 0 {
			return v[len(v)-1]
		}
		return ""
	}
	f.Type = get("scene")
	var err error
	if f.Since, err = parseWhen(get("since"), now); err != nil {
		return f, fmt.Errorf("since: %w", err)
	}
	if f.Until, err = parseWhen(get("until"), now); err != nil {
		return f, fmt.Errorf("until: %w", err)
	}
	if v := get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > store.MaxLimit {
			return f, fmt.Errorf("limit %q must be a number from 1 to %d", v, store.MaxLimit)
		}
		f.Limit = n
	}
	f.After = get("cursor")
	return f, nil
}

// parseWhen reads an RFC 3339 time or a duration before now ("1h").
func parseWhen(v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a duration like 2h", v)
	}
	return now.Add(-d), nil
}

func (s *Handler) listMissions(w http.ResponseWriter, r *http.Request) {
	f, err := missionFilter(r.URL.Query(), time.Now())
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	ms, next, err := s.opts.Driver.List(r.Context(), f)
	if err != nil {
		s.fail(w, r, err, "")
		return
	}
	out := MissionList{Missions: make([]MissionItem, len(ms)), NextCursor: next}
	for i, m := range ms {
		out.Missions[i] = ItemOf(m)
	}
	writeJSON(w, http.StatusOK, out)
}

// shortIDMin is the shortest ID prefix or suffix the API resolves: the
// progress view shows the last 8 characters of mission IDs, and people
// copy the first ones from a list.
const shortIDMin = 6

// resolve turns a unique suffix (as the progress view prints) or prefix
// of a recent mission's ID into the full ID; a full or unknown ID comes
// back as is.
func (s *Handler) resolve(ctx context.Context, id string) (string, error) {
	if len(id) < shortIDMin || len(id) >= 24 {
		return id, nil
	}
	if _, err := s.opts.Driver.Get(ctx, id); err == nil {
		return id, nil
	}
	var found []string
	f := driver.Filter{Limit: 1000}
	for range 10 { // the 10,000 newest missions
		ms, next, err := s.opts.Driver.List(ctx, f)
		if err != nil {
			return "", err
		}
		for _, m := range ms {
			if strings.HasSuffix(m.ID, id) || strings.HasPrefix(m.ID, id) {
				found = append(found, m.ID)
			}
		}
		if next == "" {
			break
		}
		f.After = next
	}
	switch len(found) {
	case 0:
		return id, nil
	case 1:
		return found[0], nil
	}
	return "", fmt.Errorf("%w: %q matches %d missions (%s, ...); give more of the ID", errAmbiguous, id, len(found), strings.Join(found[:2], ", "))
}

// errAmbiguous means a short mission ID matched several missions.
var errAmbiguous = errors.New("ambiguous mission id")

func (s *Handler) getMission(w http.ResponseWriter, r *http.Request) {
	id, err := s.resolve(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	m, err := s.opts.Driver.Get(r.Context(), id)
	if err != nil {
		s.fail(w, r, err, id)
		return
	}
	evs, err := s.opts.Driver.Timeline(r.Context(), id)
	if err != nil {
		s.fail(w, r, err, id)
		return
	}
	writeJSON(w, http.StatusOK, MissionDetail{Mission: m, Timeline: evs, Waterfall: Waterfall(m, evs, time.Now())})
}

// SubmitRequest is the body of POST /api/missions. RequestID is
// optional; without one the API makes one up, so the request is not
// idempotent.
type SubmitRequest struct {
	Scene     string          `json:"scene"`
	RequestID string          `json:"request_id,omitempty"`
	Source    string          `json:"source,omitempty"`
	Params    json.RawMessage `json:"params,omitempty"`
	// NotAfter, when set, is when the trigger goes stale (see
	// scenes.Trigger).
	NotAfter *time.Time `json:"not_after,omitempty"`
}

// IdempotencyKey is the request ID: the agent answers a repeated one
// with the mission it made, so Client may send the request again.
func (r SubmitRequest) IdempotencyKey() string { return r.RequestID }

// submit runs a scene exactly as an MQTT trigger would.
func (s *Handler) submit(w http.ResponseWriter, r *http.Request) {
	var req SubmitRequest
	if !s.decode(w, r, &req) {
		return
	}
	if req.RequestID == "" {
		req.RequestID = "http-" + randomID()
	}
	if req.Source == "" {
		req.Source = "http"
	}
	// Re-encoding lets the trigger decoder apply its own checks and
	// limits, so HTTP accepts exactly what MQTT accepts.
	payload, err := json.Marshal(req)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	tr, err := scenes.DecodeTrigger(payload)
	if err != nil {
		rep := scenes.Rejection(req.RequestID, req.Scene, err, scenes.ReasonBadJSON)
		if s.opts.Declined != nil {
			s.opts.Declined(scenes.Trigger{RequestID: req.RequestID, Scene: req.Scene, Source: req.Source}, rep)
		}
		s.writeReply(w, rep)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), submitTimeout)
	defer cancel()
	defer context.AfterFunc(s.stopped, cancel)()
	reply, err := s.opts.Trigger(ctx, tr)
	switch {
	case err == nil:
		s.writeReply(w, reply)
	case s.stopping.Load():
		writeError(w, http.StatusServiceUnavailable, CodeShuttingDown, "the agent is shutting down; retry with the same request_id")
	case errors.Is(err, ErrOverloaded), errors.Is(err, context.DeadlineExceeded):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, scenes.ReasonOverloaded, "the agent is overloaded; retry with the same request_id")
	default: // the client went away
		writeError(w, http.StatusServiceUnavailable, CodeInternal, err.Error())
	}
}

// writeReply answers a submit: the reply itself when accepted (201 for
// a new mission, 200 for a repeated request), an error otherwise.
func (s *Handler) writeReply(w http.ResponseWriter, rep scenes.Reply) {
	if rep.Status == scenes.StatusAccepted {
		status := http.StatusCreated
		if rep.Duplicate {
			status = http.StatusOK
		}
		writeJSON(w, status, rep)
		return
	}
	status := http.StatusBadRequest
	switch rep.Reason {
	case scenes.ReasonUnknownScene:
		status = http.StatusNotFound
	case scenes.ReasonTooLarge:
		status = http.StatusRequestEntityTooLarge
	case scenes.ReasonAlreadyRunning:
		status = http.StatusConflict
	case scenes.ReasonOverloaded, scenes.ReasonShuttingDown:
		status = http.StatusServiceUnavailable
		if rep.Reason == scenes.ReasonOverloaded {
			w.Header().Set("Retry-After", "1")
		}
	case scenes.ReasonInternal:
		status = http.StatusInternalServerError
	}
	writeError(w, status, rep.Reason, rep.Message)
}

// control applies pause, resume, cancel or retry.
func (s *Handler) control(w http.ResponseWriter, r *http.Request) {
	ops := map[string]func(context.Context, string) (*driver.Mission, error){
		"pause": s.opts.Driver.Pause, "resume": s.opts.Driver.Resume, "cancel": s.opts.Driver.Cancel, "retry": s.opts.Driver.Retry,
	}
	action, id := r.PathValue("action"), r.PathValue("id")
	id, err := s.resolve(r.Context(), id)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	op := ops[action]
	if op == nil {
		writeError(w, http.StatusNotFound, CodeNotFound, fmt.Sprintf("no action %q (want pause, resume, cancel, retry or priority)", action))
		return
	}
	if !s.emptyBody(w, r) {
		return
	}
	s.controlled(w, r, id, action, func(ctx context.Context) (*driver.Mission, error) { return op(ctx, id) })
}

// PriorityRequest is the body of POST /api/missions/{id}/priority.
type PriorityRequest struct {
	Priority *int `json:"priority"`
}

func (s *Handler) setPriority(w http.ResponseWriter, r *http.Request) {
	id, err := s.resolve(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	var req PriorityRequest
	if !s.decode(w, r, &req) {
		return
	}
	if req.Priority == nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, "priority is missing")
		return
	}
	s.controlled(w, r, id, "priority", func(ctx context.Context) (*driver.Mission, error) {
		return s.opts.Driver.SetPriority(ctx, id, *req.Priority)
	})
}

// controlled runs one control operation and answers with the mission.
func (s *Handler) controlled(w http.ResponseWriter, r *http.Request, id, action string, op func(context.Context) (*driver.Mission, error)) {
	m, err := op(r.Context())
	if err != nil {
		s.fail(w, r, err, id)
		return
	}
	s.opts.Log.Info("api: mission control", "mission", id, "action", action, "state", m.State, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, ItemOf(m))
}

// DeviceItem is one device of GET /api/devices.
type DeviceItem struct {
	ID        string         `json:"id"`
	Type      string         `json:"type"`
	Name      string         `json:"name,omitempty"`
	Room      string         `json:"room,omitempty"`
	Available bool           `json:"available"`
	State     map[string]any `json:"state"` // last reported; null if none yet
}

// DeviceList is the body of GET /api/devices.
type DeviceList struct {
	// Connected is false when the devices connection is down; availability
	// and state are then as last seen.
	Connected bool         `json:"connected"`
	Devices   []DeviceItem `json:"devices"`
	// Announced are the differences between what the ecosystems announce
	// and the registry: devices it does not name, and its devices their
	// ecosystem no longer announces (docs/devices.md).
	Announced []devices.Announcement `json:"announced,omitempty"`
}

// announcer is a DeviceStatus that follows the ecosystems'
// announcements (devices.Client).
type announcer interface {
	Announced() []devices.Announcement
}

func (s *Handler) listDevices(w http.ResponseWriter, _ *http.Request) {
	reg := s.registry()
	out := DeviceList{Connected: s.opts.Devices.Connected(), Devices: make([]DeviceItem, 0, len(reg.Devices))}
	for _, d := range reg.Devices {
		st, _ := s.opts.Devices.State(d.ID)
		out.Devices = append(out.Devices, DeviceItem{
			ID: d.ID, Type: d.Type, Name: d.Name, Room: d.Room, Available: s.opts.Devices.Available(d.ID), State: st,
		})
	}
	if a, ok := s.opts.Devices.(announcer); ok {
		out.Announced = a.Announced()
	}
	writeJSON(w, http.StatusOK, out)
}

// DiscoverRequest is the body of POST /api/devices/discover.
type DiscoverRequest struct {
	// Seconds is how long to listen: 1 to 60, default 5.
	Seconds int `json:"seconds,omitempty"`
}

// DiscoverResult is the answer of POST /api/devices/discover: what the
// ecosystems announced, and a registry TOML proposing every device the
// registry does not name yet.
type DiscoverResult struct {
	devices.Discovery
	TOML string `json:"toml"`
}

func (s *Handler) discover(w http.ResponseWriter, r *http.Request) {
	if s.opts.Discover == nil {
		writeError(w, http.StatusNotFound, CodeNotFound, "this agent does not discover devices")
		return
	}
	var req DiscoverRequest
	if !s.decode(w, r, &req) {
		return
	}
	switch {
	case req.Seconds == 0:
		req.Seconds = 5
	case req.Seconds < 1 || req.Seconds > 60:
		writeError(w, http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("seconds: %d is not 1 to 60", req.Seconds))
		return
	}
	d, err := s.opts.Discover(r.Context(), time.Duration(req.Seconds)*time.Second)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, CodeInternal, "discover: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, DiscoverResult{Discovery: d, TOML: devices.RegistryTOML(d, s.registry())})
}

// registry is the device registry that runs now.
func (s *Handler) registry() *devices.Registry {
	if s.opts.Registries != nil {
		return s.opts.Registries()
	}
	return s.opts.Registry
}

// SceneItem is one scene of GET /api/scenes.
type SceneItem struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Mode        scenes.Mode     `json:"mode"`
	Priority    int             `json:"priority"`
	Deadline    driver.Duration `json:"deadline"`
	Steps       int             `json:"steps"`
	Params      []SceneParam    `json:"params"`
}

// SceneParam is a trigger parameter a scene reads.
type SceneParam struct {
	Name     string `json:"name"`
	Required bool   `json:"required"`
	Default  any    `json:"default,omitempty"`
}

// SceneList is the body of GET /api/scenes.
type SceneList struct {
	Scenes []SceneItem `json:"scenes"`
}

// backup sends a copy of the database. The copy is made into a file
// beside the database first: the store's read transaction then lasts as
// long as a local copy takes, not as long as a slow client takes to
// download it, during which checkpoints (and, once the log is full,
// steps) could wait for it. The Content-Length lets any client tell a
// whole copy from a cut one. Shutdown cuts a download short rather than
// wait for it.
func (s *Handler) backup(w http.ResponseWriter, r *http.Request) {
	if !s.backingUp.CompareAndSwap(false, true) {
		writeError(w, http.StatusConflict, CodeConflict, "a backup is being sent already; try again when it is done")
		return
	}
	defer s.backingUp.Store(false)
	f, n, err := s.opts.Backup()
	if err != nil {
		writeError(w, http.StatusInternalServerError, CodeInternal, err.Error())
		return
	}
	defer func() {
		// The answer is sent by now; a copy left on disk is removed by
		// the store's next Open, but say so.
		if err := f.Close(); err != nil {
			s.opts.Log.Warn("backup copy not removed", "err", err)
		}
	}()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", `attachment; filename="missions.db"`)
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	if _, err := io.Copy(w, stopReader{s.stopped, f}); err != nil {
		s.opts.Log.Warn("backup not delivered", "bytes", n, "remote", r.RemoteAddr, "err", err)
		return
	}
	s.opts.Log.Info("backup sent", "bytes", n, "remote", r.RemoteAddr)
}

// stopReader ends a read once ctx is done.
type stopReader struct {
	ctx context.Context
	r   io.Reader
}

func (s stopReader) Read(p []byte) (int, error) {
	if err := s.ctx.Err(); err != nil {
		return 0, err
	}
	return s.r.Read(p)
}

func (s *Handler) listScenes(w http.ResponseWriter, _ *http.Request) {
	out := SceneList{Scenes: []SceneItem{}}
	cat := s.opts.Catalog
	if s.opts.Scenes != nil {
		cat = s.opts.Scenes()
	}
	for _, name := range cat.Names() {
		info, _ := cat.Scene(name)
		it := SceneItem{
			Name: info.Name, Description: info.Description, Mode: info.Mode, Priority: info.Priority,
			Deadline: driver.Duration(info.Deadline), Steps: info.Steps, Params: []SceneParam{},
		}
		for _, p := range info.Params {
			it.Params = append(it.Params, SceneParam{Name: p.Name, Required: p.Required, Default: p.Default})
		}
		out.Scenes = append(out.Scenes, it)
	}
	writeJSON(w, http.StatusOK, out)
}

// readBody reads the (bounded) body, answering 413 or 400 itself when
// it cannot.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, CodeTooLarge, fmt.Sprintf("request body is over %d bytes", mbe.Limit))
			return nil, false
		}
		writeError(w, http.StatusBadRequest, CodeBadRequest, "read body: "+err.Error())
		return nil, false
	}
	return body, true
}

// decode reads a JSON body into v, rejecting unknown fields, answering
// 400 or 413 itself when it cannot.
func (s *Handler) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	body, ok := readBody(w, r)
	if !ok {
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, scenes.ReasonBadJSON, "request body: "+err.Error())
		return false
	}
	if _, err := dec.Token(); err != io.EOF {
		writeError(w, http.StatusBadRequest, scenes.ReasonBadJSON, "request body: data after the JSON object")
		return false
	}
	return true
}

// emptyBody accepts no body or "{}" on actions that take none: anything
// else is a client mistake, such as a priority sent to the wrong action.
func (s *Handler) emptyBody(w http.ResponseWriter, r *http.Request) bool {
	body, ok := readBody(w, r)
	if !ok {
		return false
	}
	if b := bytes.TrimSpace(body); len(b) > 0 && !bytes.Equal(b, []byte("{}")) {
		writeError(w, http.StatusBadRequest, CodeBadRequest, "this action takes no body")
		return false
	}
	return true
}

// randomID makes request IDs for submits that bring none.
func randomID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// fail maps a driver or store error to a status and an error body.
func (s *Handler) fail(w http.ResponseWriter, r *http.Request, err error, id string) {
	switch {
	case errors.Is(err, driver.ErrNotFound):
		writeError(w, http.StatusNotFound, CodeNotFound, fmt.Sprintf("mission %s not found", id))
	case errors.Is(err, driver.ErrIllegalTransition), errors.Is(err, driver.ErrTerminal):
		writeError(w, http.StatusConflict, CodeConflict, err.Error())
	case errors.Is(err, driver.ErrInvalid), errors.Is(err, store.ErrCursor):
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
	case errors.Is(err, driver.ErrClosed):
		writeError(w, http.StatusServiceUnavailable, CodeShuttingDown, "the agent is shutting down")
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		// The client went away; nobody reads the answer.
	default:
		s.opts.Log.Error("api: request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		writeError(w, http.StatusInternalServerError, CodeInternal, err.Error())
	}
}

// Error is the body of every error answer; ErrorBody its code and
// message (docs/api.md).
type (
	Error     = httpjson.Error
	ErrorBody = httpjson.ErrorBody
)

func writeError(w http.ResponseWriter, status int, code, msg string) {
	httpjson.WriteError(w, status, code, msg, true)
}

func writeJSON(w http.ResponseWriter, status int, v any) { httpjson.Write(w, status, v, true) }
