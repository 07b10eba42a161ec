package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/agent/view"
	"github.com/sortie-edge/sortie/internal/cli"
)

// cmdWhy answers what happened to a trigger, or lists the latest ones
// that failed.
func cmdWhy(ctx context.Context, e *cli.Env, args []string) error {
	o := newCLIOut(e)
	fs, cf := newClientFlagSet(e)
	limit := fs.Int("limit", 20, "with no REQUEST_ID: how many of the latest to list")
	ok := fs.Bool("ok", false, "with no REQUEST_ID: list the latest that did not fail")
	verbose := fs.Bool("v", false, "also print every event of the mission")
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return &usageError{Msg: fmt.Sprintf("why takes one REQUEST_ID, got %q", pos)}
	}
	if *limit < 1 || *limit > 1000 {
		return &usageError{Msg: fmt.Sprintf("why: -limit %d is not from 1 to 1000", *limit)}
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		var list api.WhyList
		q := url.Values{"limit": {strconv.Itoa(*limit)}, "failed": {strconv.FormatBool(!*ok)}}
		raw, err := c.Call(ctx, http.MethodGet, "/api/why?"+q.Encode(), nil, &list)
		if err != nil {
			return err
		}
		return o.answer(raw, cf.json, func() string { return view.WhyList(list, view.Options{Loc: o.loc}) })
	}
	var w api.Why
	raw, err := c.Call(ctx, http.MethodGet, "/api/why/"+url.PathEscape(pos[0]), nil, &w)
	if err != nil {
		return err
	}
	return o.answer(raw, cf.json, func() string {
		return view.Why(w, view.Options{Verbose: *verbose, Loc: o.loc, Now: o.now()})
	})
}

// cmdSchedules lists the scenes' schedules and their next firings.
func cmdSchedules(ctx context.Context, e *cli.Env, args []string) error {
	o := newCLIOut(e)
	fs, cf := newClientFlagSet(e)
	next := fs.Int("next", 3, "firings to show per schedule (1 to 100)")
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	if *next < 1 || *next > 100 {
		return &usageError{Msg: fmt.Sprintf("schedules: -next %d is not from 1 to 100", *next)}
	}
	if len(pos) > 0 {
		return &usageError{Msg: fmt.Sprintf("schedules takes no arguments, got %q", pos)}
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	var list api.ScheduleList
	raw, err := c.Call(ctx, http.MethodGet, "/api/schedules?next="+strconv.Itoa(*next), nil, &list)
	if err != nil {
		return err
	}
	return o.answer(raw, cf.json, func() string { return view.Schedules(list) })
}
