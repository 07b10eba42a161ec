package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/hub"
	"github.com/sortie-edge/sortie/internal/cli"
	"github.com/sortie-edge/sortie/internal/httpjson"
)

// fleetCommands are the commands that drive a running hub's rollouts
// through its API.
var fleetCommands = []*cli.Command{
	{Name: "bundle", Summary: "store and list configuration bundles", Group: "Fleet (a running hub's API):", Subs: []*cli.Command{
		{Name: "push", Args: "[-group G] [-min-agent V] DIR", Summary: "store the bundle in DIR (devices.toml, scenes/*.toml, settings.toml)",
			Help: "Reads the bundle laid out in DIR, as \"agent apply\" does, and stores it on the hub as\n" +
				"the next version of group G. The hub refuses a bundle that does not validate\n" +
				"with the agent's rules (\"agent validate\").", ArgValues: []cli.Values{cli.Dirs}, Run: cmdBundlePush},
		{Name: "list", Args: "[-group G]", Summary: "list the releases, newest first", Run: cmdBundleList},
		{Name: "show", Args: "HASH|VERSION", Summary: "show a stored bundle", Run: cmdBundleShow},
	}},
	{Name: "rollout", Summary: "run a bundle out to gateways in stages", Subs: []*cli.Command{
		{Name: "start", Args: "[-group G] [-version N] [-gateways A,B | -tag T] [flags]", Summary: "start a rollout (a canary, then waves)",
			Help: "Starts a rollout of the group's latest bundle (or -version) to the gateways chosen:\n" +
				"a canary, then waves (-waves percentages, or -factor and -cap), each followed by\n" +
				"-soak; aborted, and rolled back, once -abort-percent of the gateways that ran it\n" +
				"failed (and at least -abort-min); ended by -deadline, gateways that never\n" +
				"answered then unreachable. A newer rollout of the group supersedes it.", Run: cmdRolloutStart},
		{Name: "status", Args: "[-gateways] [ID]", Summary: "list the rollouts, or show one", Run: cmdRolloutStatus},
		{Name: "pause", Args: "ID", Summary: "notify no more gateways", Run: rolloutOp("pause")},
		{Name: "resume", Args: "[-skip] ID", Summary: "go on (-skip: without the gateways the pre-flight check refuses)", Run: rolloutOp("resume")},
		{Name: "abort", Args: "ID", Summary: "abort, and roll back the gateways that took it", Run: rolloutOp("abort")},
	}},
	{Name: "fleet", Args: "[-drifted]", Summary: "each gateway's configuration: what runs, what should, drift", Run: cmdFleet},
	{Name: "tag", Args: "GATEWAY [TAG ...]", Summary: "set a gateway's tags (rollouts target them)", Run: cmdTag},
	{Name: "group", Args: "-drift alert|adopt|revert GROUP", Summary: "set a group's drift policy", Run: cmdGroup},
}

// apiClient reaches a running hub's API.
type apiClient struct {
	base, token string
	http        *http.Client
}

// clientFlags adds the flags that say how to reach the hub; the
// returned function makes the client after parsing.
func clientFlags(fs *flag.FlagSet) func() (*apiClient, error) {
	path := fs.String("config", "configs/hub.toml", "the hub's configuration file (its http.listen and token)")
	addr := fs.String("hub", "", "the hub's API, http://HOST:PORT (default from the configuration)")
	return func() (*apiClient, error) {
		c := &apiClient{base: *addr, http: &http.Client{Timeout: 30 * time.Second}}
		c.token = os.Getenv(tokenEnv)
		if c.base != "" && c.token != "" {
			return c, nil
		}
		cfg, err := LoadConfig(*path)
		if err != nil {
			return nil, err
		}
		if c.token == "" {
			if c.token, err = cfg.token(); err != nil {
				return nil, err
			}
		}
		if c.base == "" {
			host, port, err := net.SplitHostPort(cfg.HTTP.Listen)
			if err != nil {
				return nil, fmt.Errorf("http.listen %q: %w", cfg.HTTP.Listen, err)
			}
			if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
				host = "127.0.0.1"
			}
			c.base = "http://" + net.JoinHostPort(host, port)
		}
		return c, nil
	}
}

// call sends a request and decodes the answer into out; an error
// answer is returned as the API's message.
func (c *apiClient) call(ctx context.Context, method, path, ctype string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(c.base, "/")+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	res, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("reach the hub: %w", err)
	}
	defer func() { _ = res.Body.Close() }()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		return fmt.Errorf("read the hub's answer: %w", err)
	}
	if res.StatusCode >= 300 {
		var e httpjson.Error
		if json.Unmarshal(data, &e) == nil && e.Error.Message != "" {
			return fmt.Errorf("hub: %s (%s)", e.Error.Message, e.Error.Code)
		}
		return fmt.Errorf("hub: %s", res.Status)
	}
	if raw, ok := out.(*json.RawMessage); ok {
		*raw = data
		return nil
	}
	return json.Unmarshal(data, out)
}

// get fetches path and decodes the answer, or, with asJSON, prints it
// as it came and says so (done).
func get[T any](ctx context.Context, c *apiClient, path string, w io.Writer, asJSON bool) (out T, done bool, err error) {
	var raw json.RawMessage
	if err = c.call(ctx, http.MethodGet, path, "", nil, &raw); err != nil {
		return out, false, err
	}
	if asJSON {
		return out, true, printJSON(w, raw)
	}
	return out, false, json.Unmarshal(raw, &out)
}

// printJSON prints an answer as the API gave it, indented.
func printJSON(w io.Writer, raw json.RawMessage) error {
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return err
	}
	b.WriteByte('\n')
	_, err := w.Write(b.Bytes())
	return err
}

func oneArg(pos []string, what string) (string, error) {
	if len(pos) != 1 {
		return "", &usageError{Msg: fmt.Sprintf("want %s, got %q", what, pos)}
	}
	return pos[0], nil
}

// noArgs parses a command's flags and refuses positional arguments.
func noArgs(fs *flag.FlagSet, args []string, name string) error {
	pos, err := cli.Parse(fs, args)
	if err == nil && len(pos) > 0 {
		err = &usageError{Msg: fmt.Sprintf("%s takes no arguments, got %q", name, pos)}
	}
	return err
}

func cmdBundlePush(ctx context.Context, e *cli.Env, args []string) error {
	fs := e.FlagSet()
	mk := clientFlags(fs)
	group := fs.String("group", hub.DefaultGroup, "the target group")
	minAgent := fs.String("min-agent", "", "the oldest agent version that may run it (v1.4.0)")
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	dir, err := oneArg(pos, "one directory")
	if err != nil {
		return err
	}
	b, err := bundle.FromDir(dir, *minAgent)
	if err != nil {
		return err
	}
	enc, err := b.Encode()
	if err != nil {
		return err
	}
	c, err := mk()
	if err != nil {
		return err
	}
	var out struct {
		Release hub.Release `json:"release"`
		Created bool        `json:"created"`
	}
	if err := c.call(ctx, http.MethodPost, "/api/bundles?group="+url.QueryEscape(*group), "application/json", enc, &out); err != nil {
		return err
	}
	word := "stored"
	if !out.Created {
		word = "already the latest of its group:"
	}
	_, err = fmt.Fprintf(e.Stdout, "%s %s as version %d of group %s\n", word, bundle.Short(out.Release.Hash), out.Release.Version, out.Release.Group)
	return err
}

func cmdBundleList(ctx context.Context, e *cli.Env, args []string) error {
	fs := e.FlagSet()
	mk := clientFlags(fs)
	group := fs.String("group", "", "only this group")
	asJSON := fs.Bool("json", false, "print the API's answer")
	if err := noArgs(fs, args, "list"); err != nil {
		return err
	}
	c, err := mk()
	if err != nil {
		return err
	}
	out, done, err := get[struct {
		Releases []hub.Release `json:"releases"`
	}](ctx, c, "/api/bundles?group="+url.QueryEscape(*group), e.Stdout, *asJSON)
	if done || err != nil {
		return err
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, "VERSION\tGROUP\tHASH\tKIND\tROLLOUT\tAT")
	for _, r := range out.Releases {
		_, _ = fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", r.Version, r.Group, bundle.Short(r.Hash), r.Kind, r.Rollout, r.At.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

func cmdBundleShow(ctx context.Context, e *cli.Env, args []string) error {
	fs := e.FlagSet()
	mk := clientFlags(fs)
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	ref, err := oneArg(pos, "a hash or a version")
	if err != nil {
		return err
	}
	c, err := mk()
	if err != nil {
		return err
	}
	var raw json.RawMessage
	if err := c.call(ctx, http.MethodGet, "/api/bundles/"+url.PathEscape(ref), "", nil, &raw); err != nil {
		return err
	}
	return printJSON(e.Stdout, raw)
}

// floats reads "10,50,100".
func floats(s string) ([]float64, error) {
	if s == "" {
		return nil, nil
	}
	var out []float64
	for p := range strings.SplitSeq(s, ",") {
		f, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil {
			return nil, &usageError{Msg: fmt.Sprintf("-waves: %q is not a percentage", p)}
		}
		out = append(out, f)
	}
	return out, nil
}

func cmdRolloutStart(ctx context.Context, e *cli.Env, args []string) error {
	fs := e.FlagSet()
	mk := clientFlags(fs)
	var spec hub.RolloutSpec
	fs.StringVar(&spec.Group, "group", hub.DefaultGroup, "the target group")
	fs.Uint64Var(&spec.Version, "version", 0, "the release to roll out (default the group's latest push)")
	gateways := fs.String("gateways", "", "target these gateways (IDs, comma-separated)")
	fs.StringVar(&spec.Tag, "tag", "", "target the gateways with this tag (default every gateway)")
	fs.BoolVar(&spec.Continuous, "continuous", false, "gateways that join the target later (or come back) get it too")
	fs.IntVar(&spec.Canary, "canary", 0, "gateways in the canary (default 1)")
	fs.Float64Var(&spec.CanaryPercent, "canary-percent", 0, "or a percentage of the targets in the canary")
	waves := fs.String("waves", "", "the waves after the canary, cumulative percentages (10,50,100)")
	fs.Float64Var(&spec.Factor, "factor", 0, "or exponential waves: each this many times the one before (default 2)")
	fs.IntVar(&spec.Cap, "cap", 0, "at most this many gateways in a wave (0: no cap)")
	soak := fs.Duration("soak", 0, "the wait after each stage (default 1m)")
	gwSoak := fs.Duration("gateway-soak", 0, "each gateway's trial before it reports healthy (default its own)")
	gwTimeout := fs.Duration("gateway-timeout", 0, "how long a stage waits for one gateway (default 10m)")
	deadline := fs.Duration("deadline", 0, "the rollout ends this long after its start (default 24h)")
	resend := fs.Duration("resend", 0, "an unanswered offer is sent again, same control ID, this often (default 10s)")
	fs.IntVar(&spec.Retries, "retries", 0, "offers again after a failure that may pass (storage, validation_timeout, restarted)")
	fs.Float64Var(&spec.AbortPercent, "abort-percent", 0, "abort once this percentage of the gateways that ran it failed (default 10)")
	fs.IntVar(&spec.AbortMin, "abort-min", 0, "and at least this many (default 1)")
	asJSON := fs.Bool("json", false, "print the API's answer")
	if pos, err := cli.Parse(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return &usageError{Msg: fmt.Sprintf("start takes flags only, got %q", pos)}
	}
	var err error
	if spec.Waves, err = floats(*waves); err != nil {
		return err
	}
	if *gateways != "" {
		spec.Gateways = strings.Split(*gateways, ",")
	}
	spec.Soak, spec.GatewaySoak, spec.GatewayTimeout, spec.Deadline, spec.Resend = driver.Duration(*soak), driver.Duration(*gwSoak), driver.Duration(*gwTimeout), driver.Duration(*deadline), driver.Duration(*resend)
	body, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	c, err := mk()
	if err != nil {
		return err
	}
	var raw json.RawMessage
	if err := c.call(ctx, http.MethodPost, "/api/rollouts", "application/json", body, &raw); err != nil {
		return err
	}
	return printRollout(e.Stdout, raw, *asJSON, false)
}

func cmdRolloutStatus(ctx context.Context, e *cli.Env, args []string) error {
	fs := e.FlagSet()
	mk := clientFlags(fs)
	gateways := fs.Bool("gateways", false, "list each gateway's status and reason")
	asJSON := fs.Bool("json", false, "print the API's answer")
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	c, err := mk()
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		out, done, err := get[struct {
			Rollouts []hub.RolloutView `json:"rollouts"`
		}](ctx, c, "/api/rollouts", e.Stdout, *asJSON)
		if done || err != nil {
			return err
		}
		tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
		_, _ = fmt.Fprintln(tw, "ID\tGROUP\tVERSION\tSTATE\tTARGETS\tCOUNTS")
		for _, r := range out.Rollouts {
			_, _ = fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\n", r.ID, r.Spec.Group, r.Version, r.State, r.Targets, counts(r.Counts))
		}
		return tw.Flush()
	}
	id, err := oneArg(pos, "a rollout ID")
	if err != nil {
		return err
	}
	var raw json.RawMessage
	if err := c.call(ctx, http.MethodGet, "/api/rollouts/"+url.PathEscape(id), "", nil, &raw); err != nil {
		return err
	}
	return printRollout(e.Stdout, raw, *asJSON, *gateways)
}

func rolloutOp(op string) func(context.Context, *cli.Env, []string) error {
	return func(ctx context.Context, e *cli.Env, args []string) error {
		fs := e.FlagSet()
		mk := clientFlags(fs)
		skip := false
		if op == "resume" {
			fs.BoolVar(&skip, "skip", false, "leave out the gateways the pre-flight check refuses")
		}
		asJSON := fs.Bool("json", false, "print the API's answer")
		pos, err := cli.Parse(fs, args)
		if err != nil {
			return err
		}
		id, err := oneArg(pos, "a rollout ID")
		if err != nil {
			return err
		}
		c, err := mk()
		if err != nil {
			return err
		}
		path := "/api/rollouts/" + url.PathEscape(id) + "/" + op
		if skip {
			path += "?skip=true"
		}
		var raw json.RawMessage
		if err := c.call(ctx, http.MethodPost, path, "", nil, &raw); err != nil {
			return err
		}
		return printRollout(e.Stdout, raw, *asJSON, false)
	}
}

func counts(c map[string]int) string {
	var parts []string
	for _, k := range []string{"pending", "notified", "received", "applied", "healthy", "failed", "unreachable", "skipped", "not_sent", "superseded", "refused",
		"rollback_pending", "rollback_notified", "rollback_rolled_back", "rollback_failed", "rollback_unreachable"} {
		if c[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, c[k]))
		}
	}
	return strings.Join(parts, ", ")
}

func printRollout(w io.Writer, raw json.RawMessage, asJSON, gateways bool) error {
	if asJSON {
		return printJSON(w, raw)
	}
	var v hub.RolloutView
	if err := json.Unmarshal(raw, &v); err != nil {
		return err
	}
	_, _ = fmt.Fprintf(w, "rollout %s: %s", v.ID, v.State)
	if v.Reason != "" {
		_, _ = fmt.Fprintf(w, " (%s)", v.Reason)
	}
	_, _ = fmt.Fprintf(w, "\nbundle:   %s, version %d of group %s\n", bundle.Short(v.Hash), v.Version, v.Spec.Group)
	_, _ = fmt.Fprintf(w, "stages:   %v, at stage %d\ntargets:  %d: %s\ndeadline: %s\n", v.Stages, v.Stage, v.Targets, counts(v.Counts), v.Deadline.UTC().Format(time.RFC3339))
	if !gateways {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, "GATEWAY\tSTAGE\tSTATUS\tREASON\tROLLBACK")
	for _, t := range v.Gateways {
		reason := t.Reason
		if t.Refused != "" {
			reason = "refused: " + t.Refused
		} else if t.Message != "" {
			reason += ": " + t.Message
		}
		back := t.Back
		if t.BackReason != "" {
			back += " (" + t.BackReason + ")"
		}
		_, _ = fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", t.Gateway, t.Stage, t.Status, reason, back)
	}
	return tw.Flush()
}

func cmdFleet(ctx context.Context, e *cli.Env, args []string) error {
	fs := e.FlagSet()
	mk := clientFlags(fs)
	drifted := fs.Bool("drifted", false, "only the gateways that drifted")
	asJSON := fs.Bool("json", false, "print the API's answer")
	if err := noArgs(fs, args, "fleet"); err != nil {
		return err
	}
	c, err := mk()
	if err != nil {
		return err
	}
	out, done, err := get[struct {
		Gateways []hub.FleetGateway `json:"gateways"`
	}](ctx, c, "/api/fleet", e.Stdout, *asJSON)
	if done || err != nil {
		return err
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, "GATEWAY\tGROUP\tTAGS\tRUNS\tSOURCE\tEXPECTED\tDRIFT")
	for _, g := range out.Gateways {
		if *drifted && !g.Drifted {
			continue
		}
		runs, source := "-", "-"
		if g.Config != nil {
			runs, source = bundle.Short(g.Config.Hash), g.Config.Source
		}
		drift := ""
		if g.Drifted {
			drift = g.Drift + ", since " + g.DriftSince.UTC().Format(time.RFC3339)
		}
		_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Gateway, g.Group, strings.Join(g.Tags, ","), runs, source, bundle.Short(g.Expected), drift)
	}
	return tw.Flush()
}

func cmdTag(ctx context.Context, e *cli.Env, args []string) error {
	fs := e.FlagSet()
	mk := clientFlags(fs)
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) < 1 {
		return &usageError{Msg: "want a gateway ID, then its tags (none clears them)"}
	}
	body, _ := json.Marshal(map[string]any{"tags": append([]string{}, pos[1:]...)})
	c, err := mk()
	if err != nil {
		return err
	}
	var g hub.FleetGateway
	if err := c.call(ctx, http.MethodPut, "/api/gateways/"+url.PathEscape(pos[0])+"/tags", "application/json", body, &g); err != nil {
		return err
	}
	_, err = fmt.Fprintf(e.Stdout, "%s: tags %s\n", g.Gateway, strings.Join(g.Tags, ", "))
	return err
}

func cmdGroup(ctx context.Context, e *cli.Env, args []string) error {
	fs := e.FlagSet()
	mk := clientFlags(fs)
	policy := fs.String("drift", "", "the drift policy: alert, adopt or revert")
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	name, err := oneArg(pos, "a group name")
	if err != nil {
		return err
	}
	body, _ := json.Marshal(hub.Group{DriftPolicy: *policy})
	c, err := mk()
	if err != nil {
		return err
	}
	var g hub.Group
	if err := c.call(ctx, http.MethodPut, "/api/groups/"+url.PathEscape(name), "application/json", body, &g); err != nil {
		return err
	}
	_, err = fmt.Fprintf(e.Stdout, "group %s: drift policy %s\n", g.Name, g.DriftPolicy)
	return err
}
