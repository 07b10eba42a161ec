package api

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/sortie-edge/sortie/driver"
)

// Why is the body of GET /api/why/{request_id}: every evaluation kept
// for a request ID and, when one started a mission, that mission with
// its timeline.
type Why struct {
	RequestID string `json:"request_id"`
	// Outcome and Reason are the latest evaluation's; Explanation says
	// in words what happened and what to do.
	Outcome     string `json:"outcome"`
	Reason      string `json:"reason,omitempty"`
	Explanation string `json:"explanation"`
	// Evaluations are oldest first: the first one, then the latest
	// (Dropped counts those left out between).
	Evaluations []Evaluation   `json:"evaluations"`
	Dropped     uint64         `json:"dropped,omitempty"`
	Mission     *MissionDetail `json:"mission,omitempty"`
}

// Evaluation is one decision on a trigger.
type Evaluation struct {
	At time.Time `json:"at"`
	// Via is mqtt, api, hub or schedule.
	Via    string `json:"via"`
	Scene  string `json:"scene,omitempty"`
	Source string `json:"source,omitempty"`
	// Outcome is accepted, duplicate, rejected or skipped.
	Outcome   string `json:"outcome"`
	Reason    string `json:"reason,omitempty"`
	Message   string `json:"message,omitempty"`
	MissionID string `json:"mission_id,omitempty"`
}

// WhyList is the body of GET /api/why: the latest records, newest first.
type WhyList struct {
	Traces []Why `json:"traces"`
}

// maxWhyList bounds GET /api/why's limit.
const maxWhyList = 1000

func (s *Handler) why(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("request_id")
	if err := driver.ValidateID("request_id", id); err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	if s.opts.Why == nil {
		writeError(w, http.StatusNotFound, CodeNotFound, "this agent keeps no trigger traces")
		return
	}
	ans, err := s.opts.Why(r.Context(), id)
	if errors.Is(err, driver.ErrNotFound) {
		writeError(w, http.StatusNotFound, CodeNotFound, fmt.Sprintf("no trigger with request_id %s is recorded: it never reached this agent, its record is past the trace retention, or the agent stopped abruptly (a crash, a power cut) within moments of answering it, before the record was written", id))
		return
	}
	if err != nil {
		s.fail(w, r, err, id)
		return
	}
	writeJSON(w, http.StatusOK, ans)
}

func (s *Handler) whyList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	failed, limit := true, 20
	for key, vs := range q {
		v := vs[len(vs)-1]
		var err error
		switch key {
		case "failed":
			if failed, err = strconv.ParseBool(v); err != nil {
				err = errors.New("must be true or false")
			}
		case "limit":
			limit, err = strconv.Atoi(v)
			if err == nil && (limit < 1 || limit > maxWhyList) {
				err = fmt.Errorf("must be 1 to %d", maxWhyList)
			}
		default:
			err = errors.New("unknown parameter (failed, limit)")
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("%s: %v", key, err))
			return
		}
	}
	if s.opts.RecentWhy == nil {
		writeError(w, http.StatusNotFound, CodeNotFound, "this agent keeps no trigger traces")
		return
	}
	list, err := s.opts.RecentWhy(r.Context(), failed, limit)
	if err != nil {
		s.fail(w, r, err, "")
		return
	}
	if list == nil {
		list = []Why{}
	}
	writeJSON(w, http.StatusOK, WhyList{Traces: list})
}

// ScheduleItem is one schedule in GET /api/schedules.
type ScheduleItem struct {
	// ID is scene/name.
	ID    string `json:"id"`
	Scene string `json:"scene"`
	Name  string `json:"name"`
	// When is the cron expression or the sun event with its offset.
	When          string `json:"when"`
	TimeZone      string `json:"timezone"`
	Jitter        string `json:"jitter,omitempty"`
	CatchUp       string `json:"catch_up"`
	CatchUpWindow string `json:"catch_up_window"`
	// Cursor is the last scheduled instant handled (run, or decided
	// against); LastRequestID is its firing's request ID, for why.
	Cursor        time.Time `json:"cursor"`
	LastRequestID string    `json:"last_request_id,omitempty"`
	Next          []Firing  `json:"next"`
}

// Firing is one upcoming firing of a schedule.
type Firing struct {
	// At is when it runs: Instant, the scheduled time, plus its jitter.
	At        time.Time `json:"at"`
	Instant   time.Time `json:"instant"`
	RequestID string    `json:"request_id"`
}

// ScheduleList is the body of GET /api/schedules.
type ScheduleList struct {
	Schedules []ScheduleItem `json:"schedules"`
}

// maxNextFirings bounds GET /api/schedules' next.
const maxNextFirings = 100

func (s *Handler) listSchedules(w http.ResponseWriter, r *http.Request) {
	n := 3
	for key, vs := range r.URL.Query() {
		var err error
		switch key {
		case "next":
			n, err = strconv.Atoi(vs[len(vs)-1])
			if err == nil && (n < 1 || n > maxNextFirings) {
				err = fmt.Errorf("must be 1 to %d", maxNextFirings)
			}
		default:
			err = errors.New("unknown parameter (next)")
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("%s: %v", key, err))
			return
		}
	}
	list := []ScheduleItem{}
	if s.opts.Schedules != nil {
		list = s.opts.Schedules(n)
	}
	writeJSON(w, http.StatusOK, ScheduleList{Schedules: list})
}
