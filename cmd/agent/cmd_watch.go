package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/agent/view"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/cli"
)

// watch prints a mission's events as they are committed, one line each,
// until it is terminal, and returns its final state.
func watch(ctx context.Context, c *api.Client, id string, o cliOut, events bool) (driver.State, error) {
	m, err := c.Watch(ctx, id, func(ev driver.Event, m *driver.Mission) error {
		line := view.ProgressLine(ev, m, o.loc)
		if events {
			line = view.EventLine(ev, o.loc)
		}
		if line == "" {
			return nil
		}
		_, err := fmt.Fprintln(o.stdout, line)
		return err
	})
	if err != nil {
		if m != nil {
			return m.State, err
		}
		return "", err
	}
	_, err = fmt.Fprintf(o.stdout, "mission %s %s\n", m.ID, m.State)
	return m.State, err
}

const eventsUsage = "print the mission's state-machine events (input, from -> to) instead of progress lines"

// cmdWatch follows a mission (by default the newest) until it ends:
// exit 0 if it succeeded, 1 otherwise.
func cmdWatch(ctx context.Context, e *cli.Env, args []string) error {
	o := newCLIOut(e)
	fs, cf := newAPIFlagSet(e)
	events := fs.Bool("events", false, eventsUsage)
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
	state, err := watch(ctx, c, id, o, *events)
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
