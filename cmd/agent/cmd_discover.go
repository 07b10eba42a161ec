package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/internal/cli"
)

// cmdDiscover asks the running agent to listen for what the device
// ecosystems announce and prints a registry TOML to review and keep.
func cmdDiscover(ctx context.Context, e *cli.Env, args []string) error {
	o := newCLIOut(e)
	fs, cf := newClientFlagSet(e)
	window := fs.Duration("for", 5*time.Second, "how long to listen (1s to 60s)")
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	if *window < time.Second || *window > time.Minute {
		return &usageError{Msg: fmt.Sprintf("devices discover: -for %v is not from 1s to 60s", *window)}
	}
	if len(pos) > 0 {
		return &usageError{Msg: fmt.Sprintf("devices discover takes no arguments, got %q", pos)}
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	c.HTTP.Timeout = *window + clientTimeout
	var res api.DiscoverResult
	raw, err := c.Call(ctx, http.MethodPost, "/api/devices/discover", api.DiscoverRequest{Seconds: int(window.Round(time.Second) / time.Second)}, &res)
	if err != nil {
		return err
	}
	return o.answer(raw, cf.json, func() string { return res.TOML })
}
