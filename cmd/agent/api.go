package main

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
	"github.com/sortie-edge/sortie/scenes"
	"github.com/sortie-edge/sortie/store"
)

// API limits.
const (
	// maxBodySize bounds request bodies; triggers are smaller still
	// (scenes.MaxTriggerSize).
	maxBodySize = 64 << 10
	// submitTimeout bounds how long a submit waits for the trigger
	// goroutine before it answers "overloaded".
	submitTimeout = 30 * time.Second
)

// Error codes of the API, in {"error":{"code":...}}. Trigger rejections
// use the reply's reason (unknown_scene, invalid_param, already_running,
// ...) as their code.
const (
	codeBadRequest       = "bad_request"
	codeUnauthorized     = "unauthorized"
	codeNotFound         = "not_found"
	codeConflict         = "conflict"
	codeTooLarge         = "too_large"
	codeShuttingDown     = "shutting_down"
	codeMethodNotAllowed = "method_not_allowed"
	codeInternal         = "internal"
)

// deviceStatus is what the API reads about devices: the devices.Client.
type deviceStatus interface {
	// Connected reports whether the devices connection is up.
	Connected() bool
	// Available reports whether a device is online.
	Available(deviceID string) bool
	// State returns the device's last reported state.
	State(deviceID string) (map[string]any, bool)
}

// apiOptions are the parts of the agent the management API uses.
type apiOptions struct {
	Log *slog.Logger
	// Token, when set, is required as "Authorization: Bearer <token>" on
	// /api/; health checks and metrics stay open.
	Token    string
	Driver   *driver.Driver
	Devices  deviceStatus
	Registry *devices.Registry
	Catalog  *scenes.Catalog
	Triggers *triggers
	// Backup makes a consistent copy of the database in a temporary file
	// (store.DB.BackupFile), which is then sent.
	Backup func() (io.ReadCloser, int64, error)
}

// api is the management API. It serves JSON under /api/ and the health
// checks; startHTTP mounts it next to /metrics.
type api struct {
	apiOptions
	token []byte
	// stopped ends when the HTTP server begins shutting down: requests
	// still waiting then answer 503 instead of hanging.
	stopped  context.Context
	stop     context.CancelFunc
	stopping atomic.Bool
	// backingUp admits one backup at a time: each takes the database's
	// size in the data directory while it is sent.
	backingUp atomic.Bool
}

func newAPI(o apiOptions) *api {
	s := &api{apiOptions: o, token: []byte(o.Token)}
	s.stopped, s.stop = context.WithCancel(context.Background())
	return s
}

// shutdown marks the API as stopping; register it with
// http.Server.RegisterOnShutdown.
func (s *api) shutdown() {
	s.stopping.Store(true)
	s.stop()
}

// register adds the API's routes to mux.
func (s *api) register(mux *http.ServeMux) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	allowed := map[string][]string{}
	route := func(method, path string, h http.HandlerFunc) {
		mux.Handle(method+" "+path, s.guard(h))
		allowed[path] = append(allowed[path], method)
	}
	route("GET", "/api/missions", s.listMissions)
	route("POST", "/api/missions", s.submit)
	route("GET", "/api/missions/{id}", s.getMission)
	route("POST", "/api/missions/{id}/priority", s.setPriority)
	route("POST", "/api/missions/{id}/{action}", s.control)
	route("GET", "/api/devices", s.listDevices)
	route("GET", "/api/scenes", s.listScenes)
	route("GET", "/api/backup", s.backup)
	// GET would answer HEAD too, by making a whole copy for nothing.
	mux.Handle("HEAD /api/backup", s.guard(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "GET")
		writeError(w, http.StatusMethodNotAllowed, codeMethodNotAllowed, "/api/backup takes GET, not HEAD")
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
			writeError(w, http.StatusMethodNotAllowed, codeMethodNotAllowed, fmt.Sprintf("%s takes %s, not %s", r.URL.Path, allow, r.Method))
		}))
	}
	mux.Handle("/api/", s.guard(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, codeNotFound, fmt.Sprintf("no endpoint %s %s", r.Method, r.URL.Path))
	}))
}

// guard checks the token, refuses work while shutting down and bounds
// the body. The token is compared in constant time and never logged.
func (s *api) guard(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(s.token) > 0 {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || subtle.ConstantTimeCompare([]byte(got), s.token) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="sortie-agent"`)
				msg := "missing bearer token"
				if ok {
					msg = "wrong bearer token"
				}
				s.Log.Warn("api: unauthorized request", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "why", msg)
				writeError(w, http.StatusUnauthorized, codeUnauthorized, msg)
				return
			}
		}
		if s.stopping.Load() {
			writeError(w, http.StatusServiceUnavailable, codeShuttingDown, "the agent is shutting down")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxBodySize)
		h(w, r)
	})
}

// readyz reports whether the agent can take and run missions: the store
// answers, the devices connection is up and the server is not stopping
// (the driver is started before the listener opens and stopped after
// it closes).
func (s *api) readyz(w http.ResponseWriter, r *http.Request) {
	var reasons []string
	if _, err := s.Driver.Get(r.Context(), "readyz-probe"); err != nil && !errors.Is(err, driver.ErrNotFound) {
		reasons = append(reasons, "store: "+err.Error())
	}
	if !s.Devices.Connected() {
		reasons = append(reasons, "devices: not connected to the broker")
	}
	if s.stopping.Load() {
		reasons = append(reasons, "driver: shutting down")
	}
	if len(reasons) > 0 {
		writeJSON(w, http.StatusServiceUnavailable, readiness{Status: "not_ready", Reasons: reasons})
		return
	}
	writeJSON(w, http.StatusOK, readiness{Status: "ready"})
}

// readiness is the body of /readyz.
type readiness struct {
	Status  string   `json:"status"`
	Reasons []string `json:"reasons,omitempty"`
}

// missionItem is one row of GET /api/missions: enough to list and pick
// a mission without its steps and context.
type missionItem struct {
	ID        string         `json:"id"`
	Scene     string         `json:"scene"`
	State     driver.State   `json:"state"`
	Priority  int            `json:"priority"`
	Step      int            `json:"step"`             // current step index, from 0
	Steps     int            `json:"steps"`            // number of steps
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

func itemOf(m *driver.Mission) missionItem {
	return missionItem{
		ID: m.ID, Scene: m.Type, State: m.State, Priority: m.Priority, Step: m.Progress.Step, Steps: len(m.Steps),
		Source: m.Meta.Source, RequestID: m.Meta.RequestKey, TraceID: m.Meta.TraceID, Error: m.Error, Reason: m.Reason,
		Created: m.Meta.Created, Started: m.Meta.Started, Updated: m.Meta.Updated, Finished: m.Meta.Finished,
		Control: driver.Control{Pause: m.Control.Pause, Cancel: m.Control.Cancel},
		Undone:  undone(m),
	}
}

// missionList is the body of GET /api/missions.
type missionList struct {
	Missions []missionItem `json:"missions"`
	// NextCursor, when set, is the cursor parameter of the next page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// missionDetail is the body of GET /api/missions/{id}.
type missionDetail struct {
	Mission  *driver.Mission `json:"mission"`
	Timeline []driver.Event  `json:"timeline"`
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

func (s *api) listMissions(w http.ResponseWriter, r *http.Request) {
	f, err := missionFilter(r.URL.Query(), time.Now())
	if err != nil {
		writeError(w, http.StatusBadRequest, codeBadRequest, err.Error())
		return
	}
	ms, next, err := s.Driver.List(r.Context(), f)
	if err != nil {
		s.fail(w, r, err, "")
		return
	}
	out := missionList{Missions: make([]missionItem, len(ms)), NextCursor: next}
	for i, m := range ms {
		out.Missions[i] = itemOf(m)
	}
	writeJSON(w, http.StatusOK, out)
}

// shortIDMin is the shortest ID suffix the API resolves: the progress
// view shows the last 8 characters of mission IDs.
const shortIDMin = 6

// resolve turns a unique suffix of a recent mission's ID (as the progress
// view prints) into the full ID; a full or unknown ID comes back as is.
func (s *api) resolve(ctx context.Context, id string) (string, error) {
	if len(id) < shortIDMin || len(id) >= 24 {
		return id, nil
	}
	if _, err := s.Driver.Get(ctx, id); err == nil {
		return id, nil
	}
	var found []string
	f := driver.Filter{Limit: 1000}
	for range 10 { // the 10,000 newest missions
		ms, next, err := s.Driver.List(ctx, f)
		if err != nil {
			return "", err
		}
		for _, m := range ms {
			if strings.HasSuffix(m.ID, id) {
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

func (s *api) getMission(w http.ResponseWriter, r *http.Request) {
	id, err := s.resolve(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, http.StatusBadRequest, codeBadRequest, err.Error())
		return
	}
	m, err := s.Driver.Get(r.Context(), id)
	if err != nil {
		s.fail(w, r, err, id)
		return
	}
	evs, err := s.Driver.Timeline(r.Context(), id)
	if err != nil {
		s.fail(w, r, err, id)
		return
	}
	writeJSON(w, http.StatusOK, missionDetail{Mission: m, Timeline: evs})
}

// submitRequest is the body of POST /api/missions. RequestID is
// optional; without one the API makes one up, so the request is not
// idempotent.
type submitRequest struct {
	Scene     string          `json:"scene"`
	RequestID string          `json:"request_id,omitempty"`
	Source    string          `json:"source,omitempty"`
	Params    json.RawMessage `json:"params,omitempty"`
}

// submit runs a scene exactly as an MQTT trigger would.
func (s *api) submit(w http.ResponseWriter, r *http.Request) {
	var req submitRequest
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
		writeError(w, http.StatusBadRequest, codeBadRequest, err.Error())
		return
	}
	tr, err := scenes.DecodeTrigger(payload)
	if err != nil {
		s.writeReply(w, scenes.Rejection(req.RequestID, req.Scene, err, scenes.ReasonBadJSON))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), submitTimeout)
	defer cancel()
	defer context.AfterFunc(s.stopped, cancel)()
	reply, err := s.Triggers.call(ctx, tr)
	switch {
	case err == nil:
		s.writeReply(w, reply)
	case s.stopping.Load():
		writeError(w, http.StatusServiceUnavailable, codeShuttingDown, "the agent is shutting down; retry with the same request_id")
	case errors.Is(err, errTriggerQueueFull), errors.Is(err, context.DeadlineExceeded):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, reasonOverloaded, "the agent is overloaded; retry with the same request_id")
	default: // the client went away
		writeError(w, http.StatusServiceUnavailable, codeInternal, err.Error())
	}
}

// writeReply answers a submit: the reply itself when accepted (201 for
// a new mission, 200 for a repeated request), an error otherwise.
func (s *api) writeReply(w http.ResponseWriter, rep scenes.Reply) {
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
	case reasonAlreadyRunning:
		status = http.StatusConflict
	case reasonOverloaded, reasonShuttingDown:
		status = http.StatusServiceUnavailable
	case reasonInternal:
		status = http.StatusInternalServerError
	}
	writeError(w, status, rep.Reason, rep.Message)
}

// control applies pause, resume, cancel or retry.
func (s *api) control(w http.ResponseWriter, r *http.Request) {
	ops := map[string]func(context.Context, string) (*driver.Mission, error){
		"pause": s.Driver.Pause, "resume": s.Driver.Resume, "cancel": s.Driver.Cancel, "retry": s.Driver.Retry,
	}
	action, id := r.PathValue("action"), r.PathValue("id")
	id, err := s.resolve(r.Context(), id)
	if err != nil {
		writeError(w, http.StatusBadRequest, codeBadRequest, err.Error())
		return
	}
	op := ops[action]
	if op == nil {
		writeError(w, http.StatusNotFound, codeNotFound, fmt.Sprintf("no action %q (want pause, resume, cancel, retry or priority)", action))
		return
	}
	if !s.emptyBody(w, r) {
		return
	}
	s.controlled(w, r, id, action, func(ctx context.Context) (*driver.Mission, error) { return op(ctx, id) })
}

// priorityRequest is the body of POST /api/missions/{id}/priority.
type priorityRequest struct {
	Priority *int `json:"priority"`
}

func (s *api) setPriority(w http.ResponseWriter, r *http.Request) {
	id, err := s.resolve(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, http.StatusBadRequest, codeBadRequest, err.Error())
		return
	}
	var req priorityRequest
	if !s.decode(w, r, &req) {
		return
	}
	if req.Priority == nil {
		writeError(w, http.StatusBadRequest, codeBadRequest, "priority is missing")
		return
	}
	s.controlled(w, r, id, "priority", func(ctx context.Context) (*driver.Mission, error) {
		return s.Driver.SetPriority(ctx, id, *req.Priority)
	})
}

// controlled runs one control operation and answers with the mission.
func (s *api) controlled(w http.ResponseWriter, r *http.Request, id, action string, op func(context.Context) (*driver.Mission, error)) {
	m, err := op(r.Context())
	if err != nil {
		s.fail(w, r, err, id)
		return
	}
	s.Log.Info("api: mission control", "mission", id, "action", action, "state", m.State, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, itemOf(m))
}

// deviceItem is one device of GET /api/devices.
type deviceItem struct {
	ID        string         `json:"id"`
	Type      string         `json:"type"`
	Name      string         `json:"name,omitempty"`
	Room      string         `json:"room,omitempty"`
	Available bool           `json:"available"`
	State     map[string]any `json:"state"` // last reported; null if none yet
}

// deviceList is the body of GET /api/devices.
type deviceList struct {
	// Connected is false when the devices connection is down; availability
	// and state are then as last seen.
	Connected bool         `json:"connected"`
	Devices   []deviceItem `json:"devices"`
}

func (s *api) listDevices(w http.ResponseWriter, _ *http.Request) {
	out := deviceList{Connected: s.Devices.Connected(), Devices: make([]deviceItem, 0, len(s.Registry.Devices))}
	for _, d := range s.Registry.Devices {
		st, _ := s.Devices.State(d.ID)
		out.Devices = append(out.Devices, deviceItem{
			ID: d.ID, Type: d.Type, Name: d.Name, Room: d.Room, Available: s.Devices.Available(d.ID), State: st,
		})
	}
	writeJSON(w, http.StatusOK, out)
}

// sceneItem is one scene of GET /api/scenes.
type sceneItem struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Mode        scenes.Mode     `json:"mode"`
	Priority    int             `json:"priority"`
	Deadline    driver.Duration `json:"deadline"`
	Steps       int             `json:"steps"`
	Params      []sceneParam    `json:"params"`
}

// sceneParam is a trigger parameter a scene reads.
type sceneParam struct {
	Name     string `json:"name"`
	Required bool   `json:"required"`
	Default  any    `json:"default,omitempty"`
}

// sceneList is the body of GET /api/scenes.
type sceneList struct {
	Scenes []sceneItem `json:"scenes"`
}

// backup sends a copy of the database. The copy is made into a file
// beside the database first: the store's read transaction then lasts as
// long as a local copy takes, not as long as a slow client takes to
// download it, during which checkpoints (and, once the log is full,
// steps) could wait for it. The Content-Length lets any client tell a
// whole copy from a cut one. Shutdown cuts a download short rather than
// wait for it.
func (s *api) backup(w http.ResponseWriter, r *http.Request) {
	if !s.backingUp.CompareAndSwap(false, true) {
		writeError(w, http.StatusConflict, codeConflict, "a backup is being sent already; try again when it is done")
		return
	}
	defer s.backingUp.Store(false)
	f, n, err := s.Backup()
	if err != nil {
		writeError(w, http.StatusInternalServerError, codeInternal, err.Error())
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", `attachment; filename="missions.db"`)
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	if _, err := io.Copy(w, stopReader{s.stopped, f}); err != nil {
		s.Log.Warn("backup not delivered", "bytes", n, "remote", r.RemoteAddr, "err", err)
		return
	}
	s.Log.Info("backup sent", "bytes", n, "remote", r.RemoteAddr)
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

func (s *api) listScenes(w http.ResponseWriter, _ *http.Request) {
	out := sceneList{Scenes: []sceneItem{}}
	for _, name := range s.Catalog.Names() {
		info, _ := s.Catalog.Scene(name)
		it := sceneItem{
			Name: info.Name, Description: info.Description, Mode: info.Mode, Priority: info.Priority,
			Deadline: driver.Duration(info.Deadline), Steps: info.Steps, Params: []sceneParam{},
		}
		for _, p := range info.Params {
			it.Params = append(it.Params, sceneParam{Name: p.Name, Required: p.Required, Default: p.Default})
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
			writeError(w, http.StatusRequestEntityTooLarge, codeTooLarge, fmt.Sprintf("request body is over %d bytes", mbe.Limit))
			return nil, false
		}
		writeError(w, http.StatusBadRequest, codeBadRequest, "read body: "+err.Error())
		return nil, false
	}
	return body, true
}

// decode reads a JSON body into v, rejecting unknown fields, answering
// 400 or 413 itself when it cannot.
func (s *api) decode(w http.ResponseWriter, r *http.Request, v any) bool {
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
func (s *api) emptyBody(w http.ResponseWriter, r *http.Request) bool {
	body, ok := readBody(w, r)
	if !ok {
		return false
	}
	if b := bytes.TrimSpace(body); len(b) > 0 && !bytes.Equal(b, []byte("{}")) {
		writeError(w, http.StatusBadRequest, codeBadRequest, "this action takes no body")
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
func (s *api) fail(w http.ResponseWriter, r *http.Request, err error, id string) {
	switch {
	case errors.Is(err, driver.ErrNotFound):
		writeError(w, http.StatusNotFound, codeNotFound, fmt.Sprintf("mission %s not found", id))
	case errors.Is(err, driver.ErrIllegalTransition), errors.Is(err, driver.ErrTerminal):
		writeError(w, http.StatusConflict, codeConflict, err.Error())
	case errors.Is(err, driver.ErrInvalid), errors.Is(err, store.ErrCursor):
		writeError(w, http.StatusBadRequest, codeBadRequest, err.Error())
	case errors.Is(err, driver.ErrClosed):
		writeError(w, http.StatusServiceUnavailable, codeShuttingDown, "the agent is shutting down")
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		// The client went away; nobody reads the answer.
	default:
		s.Log.Error("api: request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		writeError(w, http.StatusInternalServerError, codeInternal, err.Error())
	}
}

// apiError is the body of every error answer.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, apiError{Error: apiErrorBody{Code: code, Message: msg}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client may be gone; nothing to do about it
}

// undone counts the steps whose effects compensation has reversed.
func undone(m *driver.Mission) int {
	n := 0
	for _, r := range m.Undo {
		if r.Status == driver.StepCompensated {
			n++
		}
	}
	return n
}
