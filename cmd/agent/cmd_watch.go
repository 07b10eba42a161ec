package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/cli"
)

// watchPoll is how often watch asks the API for new events: the API has
// no stream, and a few requests a second cost the agent nothing.
const watchPoll = 250 * time.Millisecond

// watch prints a mission's events as they are committed, one line each,
// until it is terminal, and returns its final state.
func watch(ctx context.Context, c *api.Client, id string, o cliOut) (driver.State, error) {
	printed := 0
	for {
		var d api.MissionDetail
		if _, err := c.Call(ctx, http.MethodGet, "/api/missions/"+url.PathEscape(id), nil, &d); err != nil {
			return "", err
		}
		if d.Mission == nil {
			return "", fmt.Errorf("mission %s: the answer holds no mission", id)
		}
		for _, ev := range d.Timeline[min(printed, len(d.Timeline)):] {
			if _, err := fmt.Fprintln(o.stdout, eventLine(ev, o)); err != nil {
				return "", err
			}
		}
		printed = max(printed, len(d.Timeline))
		if d.Mission.State.Terminal() {
			_, err := fmt.Fprintf(o.stdout, "mission %s %s\n", d.Mission.ID, d.Mission.State)
			return d.Mission.State, err
		}
		select {
		case <-ctx.Done():
			return d.Mission.State, ctx.Err()
		case <-time.After(watchPoll):
		}
	}
}

// eventLine is one event for a terminal.
func eventLine(ev driver.Event, o cliOut) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s  %-13s", ev.Time.In(o.loc).Format("15:04:05.000"), ev.Input)
	if ev.From != ev.To && ev.To != "" {
		fmt.Fprintf(&b, " %s -> %s", ev.From, ev.To)
	}
	if ev.StepID != "" {
		fmt.Fprintf(&b, "  step %s", ev.StepID)
		if ev.Attempt > 1 {
			fmt.Fprintf(&b, " (attempt %d)", ev.Attempt)
		}
	}
	if ev.Error != "" {
		fmt.Fprintf(&b, "  %s", ev.Error)
	}
	return b.String()
}

// cmdWatch follows a mission (by default the newest) until it ends:
// exit 0 if it succeeded, 1 otherwise.
func cmdWatch(ctx context.Context, e *cli.Env, args []string) error {
	o := newCLIOut(e)
	fs, cf := newAPIFlagSet(e)
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return &usageError{Msg: fmt.Sprintf("missions watch takes at most one ID, got %q", pos)}
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	id := ""
	if len(pos) == 1 {
		id = pos[0]
	} else {
		var list api.MissionList
		if _, err := c.Call(ctx, http.MethodGet, "/api/missions?limit=1", nil, &list); err != nil {
			return err
		}
		if len(list.Missions) == 0 {
			return errors.New("no mission to watch")
		}
		id = list.Missions[0].ID
	}
	state, err := watch(ctx, c, id, o)
	if err != nil {
		return err
	}
	return endState(state)
}

// endState maps a mission's final state to the command's result: nil
// for SUCCEEDED, exit 1 for FAILED or CANCELLED.
func endState(s driver.State) error {
	if s == driver.StateSucceeded {
		return nil
	}
	return &cli.ExitError{Code: 1, Err: fmt.Errorf("mission ended %s", s)}
}
