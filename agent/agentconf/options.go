package agentconf

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/scenes"
)

// LocationOptions maps [location]; nil when it sets nothing.
func LocationOptions(cfg Config) *agent.LocationOptions {
	l := cfg.Location
	if l.Latitude == nil && l.TimeZone == "" {
		return nil
	}
	o := &agent.LocationOptions{TimeZone: l.TimeZone}
	if l.Latitude != nil && l.Longitude != nil {
		o.Latitude, o.Longitude, o.HasPosition = *l.Latitude, *l.Longitude, true
	}
	return o
}

// Build is what the binary knows of itself, for Options.
type Build struct{ Version, Revision string }

// Options maps a validated config onto the agent's options, loading
// the files it names (registry, scenes, simulated home, secrets).
func Options(cfg Config, log *slog.Logger, bd Build) (agent.Options, error) {
	o := agent.Options{
		Gateway: cfg.GatewayID, DataDir: cfg.Path(cfg.DataDir), Logger: log, Version: bd.Version, Revision: bd.Revision,
		Driver: agent.DriverOptions{
			Workers: cfg.Driver.Workers, StepTimeout: cfg.Driver.StepTimeout.D(), StopGrace: cfg.Driver.StopGrace.D(), MaxLive: cfg.Driver.MaxLive,
		},
		Retention: agent.RetentionOptions{
			MaxAge: cfg.Retention.MaxAge.D(), MaxCount: cfg.Retention.MaxCount, MaxBytes: int64(cfg.Retention.MaxBytes), Interval: cfg.Retention.Interval.D(),
		},
		Traces: agent.TraceOptions{
			MaxAge: cfg.Traces.MaxAge.D(), FailedMaxAge: cfg.Traces.FailedMaxAge.D(), MaxBytes: int64(cfg.Traces.MaxBytes),
		},
	}
	o.Location = LocationOptions(cfg)
	if c, err := TestClock(); err != nil {
		return o, err
	} else if c != nil {
		o.Clock = c
	}
	var err error
	if o.Registry, err = devices.LoadRegistry(cfg.Path(cfg.Devices)); err != nil {
		return o, err
	}
	if o.Catalog, err = scenes.Load(cfg.Path(cfg.Scenes), o.Registry); err != nil {
		return o, err
	}
	o.Bundles = BundleOptions(cfg, log)

	b := cfg.Broker
	o.Broker = agent.BrokerOptions{
		Embedded: b.Embedded, Listen: b.Listen, URL: b.URL, Username: b.Username,
		Prefix: b.Prefix, AckTimeout: b.AckTimeout.D(),
	}
	if o.Broker.Password, err = b.password(cfg); err != nil {
		return o, err
	}
	if o.Broker.TLS, err = b.tlsConfig(cfg); err != nil {
		return o, err
	}
	if b.Embedded {
		// The agent's own TCP clients trust its certificate alone.
		if o.Broker.ServerTLS, o.Broker.TLS, err = b.ServerTLS(cfg); err != nil {
			return o, err
		}
		o.Broker.Users = BrokerUsers(b)
	}

	if h := cfg.HTTP; h.Listen != "" {
		o.HTTP.Listen = h.Listen
		if o.HTTP.Token, err = HTTPToken(cfg); err != nil {
			return o, err
		}
		if o.HTTP.TLS, _, err = h.ServerTLS(cfg); err != nil {
			return o, err
		}
	}

	if h := cfg.Hub; len(h.addrs()) > 0 {
		hb := h.broker()
		addrs := h.addrs()
		ho := &agent.HubOptions{
			URL: addrs[0], URLs: addrs[1:], ClientID: h.ClientID, NoRetain: !h.RetainStatus, Username: h.Username, Prefix: h.Prefix, OutboxMax: h.OutboxMax, Heartbeat: h.Heartbeat.D(),
		}
		if ho.Password, err = hb.password(cfg); err != nil {
			return o, fmt.Errorf("hub: %w", err)
		}
		// The environment can carry the secret instead of a file on disk.
		if p := os.Getenv("SORTIE_HUB_PASSWORD"); p != "" {
			ho.Password = p
		}
		if ho.TLS, err = hb.tlsConfig(cfg); err != nil {
			return o, fmt.Errorf("hub: %w", err)
		}
		o.Hub = ho
	}

	if cfg.HomeAssistant.Discovery {
		o.HomeAssistant = &agent.HomeAssistantOptions{Prefix: cfg.HomeAssistant.Prefix, Version: bd.Version}
	}

	if cfg.Simulator.Home != "" {
		hc, err := LoadHome(cfg.Path(cfg.Simulator.Home))
		if err != nil {
			return o, err
		}
		o.Home = hc
	}
	return o, nil
}

// HTTPToken returns the API token: token_file's content when set (read
// once, at start), else token. "" leaves the API open.
func HTTPToken(c Config) (string, error) {
	if c.HTTP.TokenFile == "" {
		return c.HTTP.Token, nil
	}
	b, err := os.ReadFile(c.Path(c.HTTP.TokenFile))
	if err != nil {
		return "", fmt.Errorf("http.token_file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("http.token_file: %s is empty", c.HTTP.TokenFile)
	}
	return tok, nil
}

// BundleOptions lets the agent take configuration bundles; nil, with a
// warning, when its own files do not make one (over bundle.MaxEncoded).
func BundleOptions(cfg Config, log *slog.Logger) *agent.BundleOptions {
	files := func() (*bundle.Bundle, error) {
		return bundle.FromFiles(cfg.Path(cfg.Devices), cfg.Path(cfg.Scenes), bundle.Settings{Location: cfg.Location})
	}
	b, err := files()
	if err != nil {
		log.Warn("configuration bundles disabled: the config files do not make one", "err", err)
		return nil
	}
	return &agent.BundleOptions{Files: b, Reread: files,
		Soak: cfg.Bundles.Soak.D(), Confirm: cfg.Bundles.Confirm.D(), ValidateTimeout: cfg.Bundles.ValidateTimeout.D()}
}
