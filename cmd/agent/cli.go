package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sortie-edge/sortie/agent/agentconf"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/agent/view"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/cli"
	"github.com/sortie-edge/sortie/scenes"
)

// The client subcommands (missions, trigger, devices, scenes) talk to a
// running agent's management API.

const (
	// defaultAPIAddr is where the client looks without -addr or -config.
	defaultAPIAddr = "127.0.0.1:8080"
	// tokenEnv holds the API token; safer than -token, which other users
	// can see in the process list.
	tokenEnv = "SORTIE_TOKEN"
	// clientTimeout bounds one API call.
	clientTimeout = 30 * time.Second
)

// clientFlags are the flags of every client subcommand.
type clientFlags struct {
	addr, token, config string
	json                bool
}

func newClientFlagSet(e *cli.Env) (*flag.FlagSet, *clientFlags) {
	fs, cf := newAPIFlagSet(e)
	fs.BoolVar(&cf.json, "json", false, "print the API's JSON instead of a table")
	return fs, cf
}

// newAPIFlagSet has the flags that say how to reach the API.
func newAPIFlagSet(e *cli.Env) (*flag.FlagSet, *clientFlags) {
	cf := &clientFlags{}
	fs := e.FlagSet()
	fs.StringVar(&cf.addr, "addr", "", "agent API address host:port or URL (default: http.listen of -config, else "+defaultAPIAddr+")")
	fs.StringVar(&cf.token, "token", "", "API token (default: $"+tokenEnv+", else the token of -config)")
	fs.StringVar(&cf.config, "config", "", "agent config file to take the address and token from")
	return fs, cf
}

// client resolves the address and token: flags, then the environment,
// then the config file, then the default.
func (cf *clientFlags) client() (*api.Client, error) {
	c := &api.Client{Token: cf.token, HTTP: &http.Client{Timeout: clientTimeout}, Hint: "set $" + tokenEnv + ", -token or -config"}
	addr := cf.addr
	if c.Token == "" {
		c.Token = os.Getenv(tokenEnv)
	}
	if cf.config != "" {
		cfg, err := LoadConfig(cf.config)
		if err != nil {
			return nil, err
		}
		if addr == "" {
			if cfg.HTTP.Listen == "" {
				return nil, fmt.Errorf("%s: http.listen is empty: the agent serves no API; pass -addr", cf.config)
			}
			addr = cfg.HTTP.Listen
			// The agent's own certificate, trusted as it is: the command
			// line reaches the API by the listen address, which the
			// certificate need not name.
			_, self, err := cfg.HTTP.ServerTLS(cfg)
			if err != nil {
				return nil, err
			}
			if self != nil {
				plain, err := baseURL(addr)
				if err != nil {
					return nil, err
				}
				addr = "https://" + strings.TrimPrefix(plain, "http://")
				c.HTTP.Transport = &http.Transport{TLSClientConfig: self}
			}
		}
		if c.Token == "" {
			if c.Token, err = agentconf.HTTPToken(cfg); err != nil {
				return nil, err
			}
		}
	}
	if addr == "" {
		addr = defaultAPIAddr
	}
	base, err := baseURL(addr)
	if err != nil {
		return nil, err
	}
	c.Base = base
	return c, nil
}

// baseURL turns a listen address into a URL to dial: a wildcard host
// means this host.
func baseURL(addr string) (string, error) {
	if strings.HasPrefix(addr, "http://") || strings.HasPrefix(addr, "https://") {
		u, err := url.Parse(addr)
		if err != nil || u.Host == "" {
			return "", &usageError{Msg: fmt.Sprintf("-addr %q is not a URL", addr)}
		}
		return strings.TrimSuffix(addr, "/"), nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", &usageError{Msg: fmt.Sprintf("-addr %q is not host:port", addr)}
	}
	if port == "0" {
		return "", fmt.Errorf("address %s has port 0 (chosen at start): pass the agent's real address with -addr", addr)
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return "http://" + net.JoinHostPort(host, port), nil
}

// cliOut is where a client subcommand writes.
type cliOut struct {
	stdout, stderr io.Writer
	loc            *time.Location
	now            func() time.Time
}

func newCLIOut(e *cli.Env) cliOut {
	return cliOut{stdout: e.Stdout, stderr: e.Stderr, loc: time.Local, now: time.Now}
}

// missionsAction is the command "missions ACTION": it lists, shows and
// controls missions.
func missionsAction(action string) func(context.Context, *cli.Env, []string) error {
	return func(ctx context.Context, e *cli.Env, args []string) error {
		return cmdMissions(ctx, e, action, args)
	}
}

// cmdMissions runs "missions ACTION".
func cmdMissions(ctx context.Context, e *cli.Env, action string, args []string) error {
	o := newCLIOut(e)
	fs, cf := newClientFlagSet(e)
	var (
		state, scene, since, cursor string
		limit                       int
		verbose                     bool
	)
	switch action {
	case "list":
		fs.StringVar(&state, "state", "", "only these states, comma-separated (e.g. RUNNING,FAILED)")
		fs.StringVar(&scene, "scene", "", "only this scene")
		fs.StringVar(&since, "since", "", "only missions created since: RFC 3339 time or duration ago (2h)")
		fs.StringVar(&cursor, "cursor", "", "continue a list after this cursor")
		fs.IntVar(&limit, "limit", 50, "at most this many missions")
	case "show":
		fs.BoolVar(&verbose, "v", false, "also list every event")
	}
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	want := 1
	switch action {
	case "list":
		want = 0
	case "priority":
		want = 2
	}
	if len(pos) != want {
		return &usageError{Msg: fmt.Sprintf("missions %s takes %d argument(s), got %d", action, want, len(pos))}
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	switch action {
	case "list":
		q := url.Values{}
		for k, v := range map[string]string{"state": state, "scene": scene, "since": since, "cursor": cursor} {
			if v != "" {
				q.Set(k, v)
			}
		}
		q.Set("limit", strconv.Itoa(limit))
		var list api.MissionList
		raw, err := c.Call(ctx, http.MethodGet, "/api/missions?"+q.Encode(), nil, &list)
		if err != nil {
			return err
		}
		// The next page keeps the filters and page size.
		var again strings.Builder
		for _, f := range [][2]string{{"state", state}, {"scene", scene}, {"since", since}, {"limit", strconv.Itoa(limit)}} {
			if f[1] != "" {
				fmt.Fprintf(&again, " -%s %s", f[0], f[1])
			}
		}
		return o.answer(raw, cf.json, func() string { return view.List(list, o.loc, again.String()) })
	case "show":
		var d api.MissionDetail
		raw, err := c.Call(ctx, http.MethodGet, "/api/missions/"+url.PathEscape(pos[0]), nil, &d)
		if err != nil {
			return err
		}
		if d.Mission == nil && !cf.json {
			return fmt.Errorf("mission %s: the answer holds no mission", pos[0])
		}
		return o.answer(raw, cf.json, func() string {
			vo := view.Options{Verbose: verbose, Loc: o.loc, Now: o.now()}
			if tty, colour := terminal(o.stdout); tty {
				vo.Waterfall, vo.Color = d.Waterfall, colour
			}
			return view.Mission(d.Mission, d.Timeline, vo)
		})
	}
	var body any
	if action == "priority" {
		p, err := strconv.Atoi(pos[1])
		if err != nil {
			return &usageError{Msg: fmt.Sprintf("priority %q is not a whole number (%d..%d)", pos[1], driver.MinPriority, driver.MaxPriority)}
		}
		body = api.PriorityRequest{Priority: &p}
	}
	var it api.MissionItem
	raw, err := c.Call(ctx, http.MethodPost, "/api/missions/"+url.PathEscape(pos[0])+"/"+action, body, &it)
	if err != nil {
		return err
	}
	return o.answer(raw, cf.json, func() string { return view.ControlLine(action, it) + "\n" })
}

// cmdTrigger runs a scene through the API, as an MQTT trigger would.
func cmdTrigger(ctx context.Context, e *cli.Env, args []string) error {
	o := newCLIOut(e)
	fs, cf := newClientFlagSet(e)
	requestID := fs.String("request-id", "", "request ID; repeating it returns the same mission (default: a new one)")
	source := fs.String("source", "cli", "who asks, recorded on the mission")
	wait := fs.Bool("wait", false, "follow the mission until it ends: exit 0 if it succeeded, 1 if it failed or was cancelled, 2 if the trigger was rejected")
	events := fs.Bool("events", false, "with -wait: "+eventsUsage)
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return &usageError{Msg: "trigger needs a scene"}
	}
	params, err := cli.Params(pos[1:])
	if err != nil {
		return err
	}
	if *requestID == "" {
		// Made here rather than by the agent, so that a trigger the agent
		// cannot take now can be sent again as the same request.
		var b [8]byte
		_, _ = rand.Read(b[:])
		*requestID = "cli-" + hex.EncodeToString(b[:])
	}
	req := api.SubmitRequest{Scene: pos[0], RequestID: *requestID, Source: *source}
	if len(params) > 0 {
		if req.Params, err = json.Marshal(params); err != nil {
			return err
		}
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	var rep scenes.Reply
	raw, err := c.Call(ctx, http.MethodPost, "/api/missions", req, &rep)
	if err != nil {
		var ce *api.CallError
		if errors.As(err, &ce) && (ce.Code == scenes.ReasonOverloaded || ce.Code == scenes.ReasonShuttingDown) {
			return fmt.Errorf("scene %s not run now (%s): %s\nto send it again as the same request: agent trigger %s -request-id %s", pos[0], ce.Code, ce.Message, strings.Join(args, " "), *requestID)
		}
		if errors.As(err, &ce) && ce.Status != http.StatusUnauthorized && ce.Status < 500 {
			err := fmt.Errorf("scene %s rejected (%s): %s\nrequest %s; ask why later: %s why %s", pos[0], ce.Code, ce.Message, *requestID, self(), *requestID)
			if *wait {
				return &cli.ExitError{Code: 2, Err: err}
			}
			return err
		}
		return err
	}
	if cf.json && !*wait {
		_, err = o.stdout.Write(raw)
		return err
	}
	if *wait {
		if _, err := fmt.Fprintf(o.stdout, "mission %s accepted (%s, request %s)\n", rep.MissionID, rep.Scene, rep.RequestID); err != nil {
			return err
		}
		state, err := watch(ctx, c, rep.MissionID, o, *events)
		if err != nil {
			return err
		}
		return endState(state)
	}
	if rep.Duplicate {
		_, err = fmt.Fprintf(o.stdout, "request %s was already accepted as mission %s (%s, %s)\n", rep.RequestID, rep.MissionID, rep.Scene, rep.State)
		return err
	}
	_, err = fmt.Fprintf(o.stdout, "mission %s accepted (%s, %s, request %s)\nfollow it: %s missions show %s\n",
		rep.MissionID, rep.Scene, rep.State, rep.RequestID, self(), rep.MissionID)
	return err
}

// self is how this binary was invoked (./bin/agent, sortie-agent), for
// hints that can be pasted as they are.
func self() string {
	if len(os.Args) == 0 || os.Args[0] == "" || strings.HasSuffix(os.Args[0], ".test") {
		return "agent"
	}
	return os.Args[0]
}

// cmdDevices lists the registry's devices with their last known state.
func cmdDevices(ctx context.Context, e *cli.Env, args []string) error {
	if len(args) > 0 && args[0] == "discover" {
		return cmdDiscover(ctx, e, args[1:])
	}
	o := newCLIOut(e)
	var list api.DeviceList
	var warned error
	err := o.list(ctx, e, args, "/api/devices", &list, func() string {
		if !list.Connected {
			_, warned = fmt.Fprintln(o.stderr, "warning: the agent is not connected to the broker; availability and state may be stale")
		}
		return view.Devices(list)
	})
	return errors.Join(err, warned)
}

// cmdScenes lists the scenes the agent can run.
func cmdScenes(ctx context.Context, e *cli.Env, args []string) error {
	var list api.SceneList
	o := newCLIOut(e)
	return o.list(ctx, e, args, "/api/scenes", &list, func() string { return view.Scenes(list) })
}

// list runs a client subcommand that takes no arguments: it gets path
// into out and prints it (answer).
func (o cliOut) list(ctx context.Context, e *cli.Env, args []string, path string, out any, text func() string) error {
	fs, cf := newClientFlagSet(e)
	if pos, err := cli.Parse(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return &usageError{Msg: fmt.Sprintf("%s takes no arguments, got %q", e.Path(), pos)}
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	raw, err := c.Call(ctx, http.MethodGet, path, nil, out)
	if err != nil {
		return err
	}
	return o.answer(raw, cf.json, text)
}

// answer prints an API answer: its JSON as sent with -json, else text.
func (o cliOut) answer(raw []byte, asJSON bool, text func() string) error {
	if asJSON {
		_, err := o.stdout.Write(raw)
		return err
	}
	_, err := io.WriteString(o.stdout, text())
	return err
}
