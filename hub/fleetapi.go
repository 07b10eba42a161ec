package hub

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/sortie-edge/sortie/bundle"
)

// fleetRoutes mounts the bundle, rollout and drift endpoints
// (docs/api.md, "Bundles and rollouts").
func (a *API) fleetRoutes() {
	f := func(h func(*Fleet, http.ResponseWriter, *http.Request)) http.HandlerFunc {
		return a.auth(func(w http.ResponseWriter, r *http.Request) {
			fl := a.fleet()
			if fl == nil {
				writeError(w, http.StatusNotImplemented, "no_rollouts", "this hub's store keeps no rollouts")
				return
			}
			h(fl, w, r)
		})
	}
	a.mux.HandleFunc("GET /api/bundles", f(a.listBundles))
	a.mux.HandleFunc("POST /api/bundles", f(a.pushBundle))
	a.mux.HandleFunc("GET /api/bundles/{ref}", f(a.showBundle))
	a.mux.HandleFunc("GET /api/rollouts", f(read(a, func(fl *Fleet, w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"rollouts": fl.Rollouts()})
	})))
	a.mux.HandleFunc("POST /api/rollouts", f(a.startRollout))
	a.mux.HandleFunc("GET /api/rollouts/{id}", f(read(a, func(fl *Fleet, w http.ResponseWriter, r *http.Request) {
		sel, paged, err := parseRolloutSelect(r.URL.Query())
		if err != nil {
			a.fail(w, r, err)
			return
		}
		var v RolloutView
		if paged {
			v, err = fl.RolloutPage(r.PathValue("id"), sel)
		} else {
			v, err = fl.Rollout(r.PathValue("id"))
		}
		if err != nil {
			a.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, v)
	})))
	a.mux.HandleFunc("POST /api/rollouts/{id}/{op}", f(a.rolloutOp))
	a.mux.HandleFunc("GET /api/fleet", f(read(a, func(fl *Fleet, w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"gateways": fl.Gateways()})
	})))
	a.mux.HandleFunc("PUT /api/gateways/{gw}/tags", f(func(fl *Fleet, w http.ResponseWriter, r *http.Request) {
		var req struct {
			Tags []string `json:"tags"`
		}
		if status, code, err := decodeBody(w, r, &req); err != nil {
			writeError(w, status, code, err.Error())
			return
		}
		g, err := fl.SetTags(r.Context(), r.PathValue("gw"), req.Tags)
		if err != nil {
			a.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, g)
	}))
	a.mux.HandleFunc("GET /api/groups", f(read(a, func(fl *Fleet, w http.ResponseWriter, r *http.Request) {
		gs, err := fl.Groups(r.Context())
		if err != nil {
			a.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"groups": gs})
	})))
	a.mux.HandleFunc("PUT /api/groups/{group}", f(func(fl *Fleet, w http.ResponseWriter, r *http.Request) {
		var g Group
		if status, code, err := decodeBody(w, r, &g); err != nil {
			writeError(w, status, code, err.Error())
			return
		}
		g.Name = r.PathValue("group")
		out, err := fl.SetGroup(r.Context(), g)
		if err != nil {
			a.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, out)
	}))
}

// read serves h from the engine's state: its own, or, on a cluster
// replica that does not drive the rollouts, the store's now.
func read(a *API, h func(*Fleet, http.ResponseWriter, *http.Request)) func(*Fleet, http.ResponseWriter, *http.Request) {
	return func(fl *Fleet, w http.ResponseWriter, r *http.Request) {
		rd, err := fl.reader(r.Context())
		if err != nil {
			a.fail(w, r, err)
			return
		}
		h(rd, w, r)
	}
}

func (a *API) fleet() *Fleet {
	if s, ok := a.svc.(interface{ Fleet() *Fleet }); ok {
		return s.Fleet()
	}
	return nil
}

func (a *API) listBundles(fl *Fleet, w http.ResponseWriter, r *http.Request) {
	rels, err := fl.st.Releases(r.Context(), r.URL.Query().Get("group"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if rels == nil {
		rels = []Release{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"releases": rels})
}

// pushBundle takes a bundle's canonical encoding as the body (what
// bundle.Bundle.Encode writes), its group as ?group=.
func (a *API) pushBundle(fl *Fleet, w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, bundle.MaxEncoded))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("a bundle is at most %d bytes encoded", bundle.MaxEncoded))
			return
		}
		writeError(w, http.StatusBadRequest, "invalid_body", err.Error())
		return
	}
	rel, created, err := fl.PushBundle(r.Context(), r.URL.Query().Get("group"), body)
	if errors.Is(err, ErrInvalid) {
		writeError(w, http.StatusUnprocessableEntity, "invalid_bundle", err.Error())
		return
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, map[string]any{"release": rel, "created": created})
}

// showBundle answers a bundle by hash (or its 12-digit short form) or
// by a release's version.
func (a *API) showBundle(fl *Fleet, w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("ref")
	hash := ref
	if v, err := strconv.ParseUint(ref, 10, 64); err == nil && len(ref) < 12 {
		rels, err := fl.st.Releases(r.Context(), "")
		if err != nil {
			a.fail(w, r, err)
			return
		}
		hash = ""
		for _, rel := range rels {
			if rel.Version == v {
				hash = rel.Hash
			}
		}
	} else if len(ref) < 64 {
		rels, err := fl.st.Releases(r.Context(), "")
		if err != nil {
			a.fail(w, r, err)
			return
		}
		for _, rel := range rels {
			if len(ref) >= 6 && rel.Hash[:len(ref)] == ref {
				hash = rel.Hash
			}
		}
	}
	info, _, err := fl.st.Bundle(r.Context(), hash)
	if err != nil {
		a.fail(w, r, fmt.Errorf("%w: no bundle %q", ErrNotFound, ref))
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (a *API) startRollout(fl *Fleet, w http.ResponseWriter, r *http.Request) {
	var spec RolloutSpec
	if status, code, err := decodeBody(w, r, &spec); err != nil {
		writeError(w, status, code, err.Error())
		return
	}
	v, err := fl.StartRollout(r.Context(), spec)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, v)
}

func (a *API) rolloutOp(fl *Fleet, w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var v RolloutView
	var err error
	switch r.PathValue("op") {
	case "pause":
		v, err = fl.Pause(r.Context(), id)
	case "resume":
		v, err = fl.Resume(r.Context(), id, r.URL.Query().Get("skip") == "true")
	case "abort":
		v, err = fl.Abort(r.Context(), id)
	default:
		writeError(w, http.StatusNotFound, "not_found", "no such operation: "+r.PathValue("op")+" (pause, resume, abort)")
		return
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}
