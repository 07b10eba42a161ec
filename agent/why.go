package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/scenes"
	"github.com/sortie-edge/sortie/store"
)

// Why answers "what happened to this trigger": every evaluation kept for
// the request ID, in words, and the mission it started with its
// timeline. A trigger whose record was pruned is still answered from
// its mission while that is kept. It fails with driver.ErrNotFound when
// neither is.
func (a *Agent) Why(ctx context.Context, requestID string) (api.Why, error) {
	tr, err := a.traces.trace(ctx, requestID)
	if err != nil && !errors.Is(err, driver.ErrNotFound) {
		return api.Why{}, err
	}
	m, merr := a.drv.Lookup(ctx, requestID)
	if merr != nil && !errors.Is(merr, driver.ErrNotFound) {
		return api.Why{}, merr
	}
	if merr != nil {
		m = nil
	}
	if len(tr.Evaluations) == 0 {
		if m == nil {
			return api.Why{}, fmt.Errorf("request %s: %w", requestID, driver.ErrNotFound)
		}
		// Accepted before traces were kept, or its record was pruned.
		tr = store.Trace{RequestID: requestID, Evaluations: []store.Evaluation{{
			RequestID: requestID, At: m.Meta.Created, Scene: m.Type, Source: m.Meta.Source,
			Outcome: outcomeAccepted, MissionID: m.ID,
		}}}
	}
	ans := whyOf(tr, m)
	if m != nil {
		evs, err := a.drv.Timeline(ctx, m.ID)
		if err != nil {
			return api.Why{}, err
		}
		ans.Mission = &api.MissionDetail{Mission: m, Timeline: evs}
		ans.Explanation = explain(tr, m)
	}
	return ans, nil
}

// RecentWhy lists the latest trace records, newest first: the failed
// ones (rejected or skipped) or the others. Missions are not read: ask
// Why for one.
func (a *Agent) RecentWhy(ctx context.Context, failed bool, limit int) ([]api.Why, error) {
	_ = a.traces.flush() // logged there; the list then misses only the batch not yet written
	trs, err := a.db.RecentTraces(ctx, failed, limit)
	if err != nil {
		return nil, err
	}
	out := make([]api.Why, 0, len(trs))
	for _, tr := range trs {
		out = append(out, whyOf(tr, nil))
	}
	return out, nil
}

func whyOf(tr store.Trace, m *driver.Mission) api.Why {
	ans := api.Why{RequestID: tr.RequestID, Dropped: tr.Dropped}
	for _, e := range tr.Evaluations {
		ans.Evaluations = append(ans.Evaluations, api.Evaluation{
			At: e.At, Via: e.Via, Scene: e.Scene, Source: e.Source, Outcome: e.Outcome,
			Reason: e.Reason, Message: e.Message, MissionID: e.MissionID,
		})
	}
	last := tr.Evaluations[len(tr.Evaluations)-1]
	ans.Outcome, ans.Reason = last.Outcome, last.Reason
	ans.Explanation = explain(tr, m)
	return ans
}

// explain says in words what the evaluations of one request ID came to:
// the latest decision, and the mission if one was started.
func explain(tr store.Trace, m *driver.Mission) string {
	last := tr.Evaluations[len(tr.Evaluations)-1]
	when := last.At.Format(time.DateTime + " MST")
	var b strings.Builder
	switch last.Outcome {
	case outcomeAccepted:
		fmt.Fprintf(&b, "Accepted at %s: it started mission %s of scene %s.", when, last.MissionID, last.Scene)
		if last.Reason == reasonCaughtUp {
			fmt.Fprintf(&b, " %s.", strings.TrimSuffix(last.Message, "."))
		}
	case outcomeDuplicate:
		fmt.Fprintf(&b, "Sent again at %s with a request_id already accepted, so it started nothing new: the first request's mission is %s.", when, last.MissionID)
	case outcomeSkipped:
		fmt.Fprintf(&b, "Skipped at %s: %s. Nothing was started.", when, strings.TrimSuffix(last.Message, "."))
	default:
		fmt.Fprintf(&b, "Rejected at %s %s. Nothing was started", when, rejectionWords(last))
		if last.Via == viaSchedule && transient(last.Reason) {
			b.WriteString("; the schedule tries the firing again while it is within its catch-up window")
		}
		if hint := rejectionHint(last.Reason); hint != "" && last.Via != viaSchedule {
			fmt.Fprintf(&b, "; %s", hint)
		}
		b.WriteString(".")
	}
	if m != nil {
		fmt.Fprintf(&b, " Mission %s is %s", m.ID, m.State)
		if m.Error != "" {
			fmt.Fprintf(&b, ": %s", m.Error)
		}
		b.WriteString(".")
	}
	if n := len(tr.Evaluations) + int(tr.Dropped); n > 1 {
		fmt.Fprintf(&b, " The request was evaluated %d times; the first: %s.", n, tr.Evaluations[0].Outcome)
	}
	return b.String()
}

// rejectionWords says what a rejection was: its reason in a few plain
// words, then the message that says exactly what (which the reason's
// words would only repeat).
func rejectionWords(e store.Evaluation) string {
	var what string
	switch e.Reason {
	case scenes.ReasonUnknownScene:
		what = "unknown scene"
	case scenes.ReasonInvalidParam:
		what = "invalid parameter"
	case scenes.ReasonBadJSON, scenes.ReasonTooLarge, scenes.ReasonMissingField, scenes.ReasonInvalidField:
		what = "malformed trigger"
	case scenes.ReasonAlreadyRunning:
		what = "already running"
	case scenes.ReasonOverloaded:
		what = "the agent was at capacity"
	case scenes.ReasonShuttingDown:
		what = "the agent was shutting down"
	case scenes.ReasonDeadlinePassed:
		what = "too late"
	case scenes.ReasonInternal:
		what = "internal failure; the agent's log says more"
	default:
		what = e.Reason
	}
	if e.Message == "" {
		return what
	}
	return "(" + what + ") " + e.Message
}

func rejectionHint(reason string) string {
	switch reason {
	case scenes.ReasonOverloaded, scenes.ReasonShuttingDown, scenes.ReasonInternal:
		return "send it again with the same request_id"
	case scenes.ReasonInvalidParam, scenes.ReasonBadJSON, scenes.ReasonTooLarge, scenes.ReasonMissingField, scenes.ReasonInvalidField, scenes.ReasonUnknownScene:
		return "fix the trigger and send it again (a rejection created nothing, so the same request_id may be reused)"
	}
	return ""
}
