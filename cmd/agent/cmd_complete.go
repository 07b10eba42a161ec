package main

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/internal/cli"
)

// completeTimeout bounds the API call of a completion: a TAB that finds
// no agent must not hang the shell.
const completeTimeout = 2 * time.Second

// completeLimit is how many missions or requests a completion offers,
// the newest.
const completeLimit = "100"

// cmdComplete is "agent __complete scenes|missions|requests", which the
// shell completion scripts run for the values only a running agent
// knows: it prints them one a line, reaching the agent as the client
// commands do (-addr, -token, -config, $SORTIE_TOKEN). It prints nothing
// and exits 0 when the agent cannot tell: a completion has nowhere to
// report an error.
func cmdComplete(ctx context.Context, e *cli.Env, args []string) error {
	fs, cf := newAPIFlagSet(e)
	pos, err := cli.Parse(fs, args)
	if err != nil || len(pos) != 1 {
		return nil
	}
	c, err := cf.client()
	if err != nil {
		return nil
	}
	c.HTTP.Timeout = completeTimeout
	var words []string
	switch pos[0] {
	case "scenes":
		words = ask(ctx, c, "/api/scenes", func(l api.SceneList, add func(string)) {
			for _, s := range l.Scenes {
				add(s.Name)
			}
		})
	case "missions":
		words = ask(ctx, c, "/api/missions?limit="+completeLimit, func(l api.MissionList, add func(string)) {
			for _, m := range l.Missions {
				add(m.ID)
			}
		})
	case "requests":
		words = ask(ctx, c, "/api/why?failed=true&limit="+completeLimit, func(l api.WhyList, add func(string)) {
			for _, w := range l.Traces {
				add(w.RequestID)
			}
		})
	}
	if len(words) == 0 {
		return nil
	}
	_, _ = e.Stdout.Write([]byte(strings.Join(words, "\n") + "\n")) // to the shell; nowhere to report a failure
	return nil
}

// ask gets path's list L from the API and returns the words each adds,
// none if the API does not answer.
func ask[L any](ctx context.Context, c *api.Client, path string, each func(L, func(string))) []string {
	var list L
	if _, err := c.Call(ctx, http.MethodGet, path, nil, &list); err != nil {
		return nil
	}
	var words []string
	each(list, func(w string) { words = append(words, w) })
	return words
}
