package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/sortie-edge/sortie/agent/api"

	"github.com/sortie-edge/sortie/agent/view"
	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/internal/cli"
	"github.com/sortie-edge/sortie/uplink"
)

// cmdApply sends a directory's bundle to the running agent, which runs
// it on trial or rejects it (docs/fleet.md).
func cmdApply(ctx context.Context, e *cli.Env, args []string) error {
	o := newCLIOut(e)
	fs, cf := newClientFlagSet(e)
	minAgent := fs.String("min-agent", "", "the oldest agent version the bundle needs (v1.2.3)")
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return &usageError{Msg: fmt.Sprintf("apply takes one DIR, got %q", pos)}
	}
	b, err := bundle.FromDir(pos[0], *minAgent)
	if err != nil {
		return err
	}
	enc, err := b.Encode()
	if err != nil {
		return err
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	var out api.BundleOutcome
	raw, err := c.Call(ctx, http.MethodPost, "/api/config/bundle", json.RawMessage(enc), &out)
	if err != nil {
		return err
	}
	err = o.answer(raw, cf.json, func() string {
		s := view.Outcome(out, view.Options{Loc: o.loc}) + "\n"
		if out.Status == uplink.BundleApplied {
			s += "on trial; \"agent config\" shows when it is kept or reverted\n"
		}
		return s
	})
	if err == nil && out.Status == uplink.BundleRejected {
		err = &cli.ExitError{Code: 1, Err: fmt.Errorf("bundle rejected: %s", out.Reason)}
	}
	return err
}

// cmdConfig shows the configuration the agent runs.
func cmdConfig(ctx context.Context, e *cli.Env, args []string) error {
	var info api.ConfigInfo
	o := newCLIOut(e)
	return o.list(ctx, e, args, "/api/config", &info, func() string { return view.Config(info, view.Options{Loc: o.loc, Now: o.now()}) })
}
