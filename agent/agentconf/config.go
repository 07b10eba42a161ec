package agentconf

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/devices/wire"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/conf"
)

// Config is the agent's configuration file (configs/agent.toml).
type Config struct {
	// GatewayID names this gateway in topics, events and the hub.
	GatewayID string `toml:"gateway_id"`
	// DataDir holds the mission database.
	DataDir string `toml:"data_dir"`
	// Devices is the device registry file; Scenes the scene directory.
	Devices string `toml:"devices"`
	Scenes  string `toml:"scenes"`

	Broker    BrokerConfig    `toml:"broker"`
	HTTP      HTTPConfig      `toml:"http"`
	Log       LogConfig       `toml:"log"`
	Driver    DriverConfig    `toml:"driver"`
	Simulator SimulatorConfig `toml:"simulator"`
	Hub       HubConfig       `toml:"hub"`
	Retention RetentionConfig `toml:"retention"`
	Traces    TracesConfig    `toml:"traces"`
	Location  LocationConfig  `toml:"location"`
	// HomeAssistant announces the scenes to Home Assistant.
	HomeAssistant HomeAssistantConfig `toml:"homeassistant"`
	// Bundles says how a configuration bundle is put on trial.
	Bundles BundlesConfig `toml:"bundles"`

	// Dir is the directory of the config file; relative paths in it are
	// resolved against it so the agent can be started from anywhere.
	Dir string `toml:"-"`
}

// BrokerConfig says which MQTT broker devices and apps use.
type BrokerConfig struct {
	// Embedded runs a mochi broker inside the agent on Listen.
	Embedded bool   `toml:"embedded"`
	Listen   string `toml:"listen"`
	// URL is an external broker (tcp://, ssl://, tls://, mqtts://) used
	// when Embedded is false.
	URL      string `toml:"url"`
	Username string `toml:"username"`
	Password string `toml:"password"`
	// PasswordFile, if set, holds the password (keeps secrets out of the
	// config file).
	PasswordFile string `toml:"password_file"`
	CAFile       string `toml:"ca_file"`
	CertFile     string `toml:"cert_file"`
	KeyFile      string `toml:"key_file"`
	// Insecure skips verification of the broker's certificate.
	Insecure bool `toml:"insecure_skip_verify"`
	// Prefix is the topic prefix for devices, triggers and events.
	Prefix string `toml:"prefix"`
	// AckTimeout is how long a command waits for its ack by default.
	AckTimeout driver.Duration `toml:"ack_timeout"`
	// ServerCertFile and ServerKeyFile make the embedded broker speak
	// MQTT over TLS on Listen.
	ServerCertFile string `toml:"server_cert_file"`
	ServerKeyFile  string `toml:"server_key_file"`
	// Users may connect to the embedded broker, each confined to its
	// role's topics; none lets every client in (see brokerAuth).
	Users []BrokerUser `toml:"users"`
}

// BrokerUser is a client of the embedded broker.
type BrokerUser struct {
	// Name is the MQTT user name; a device's is its ID.
	Name string `toml:"name"`
	// Role is "device", "app" or "admin", or an ecosystem's:
	// "zigbee2mqtt", "tasmota", "shelly", "esphome", "homeassistant" (with Scope).
	Role string `toml:"role"`
	// Scope is an ecosystem device's topic or topic prefix.
	Scope string `toml:"scope"`
	// PasswordHash is made by "agent passwd".
	PasswordHash string `toml:"password_hash"`
}

// HTTPConfig is the management API (health, metrics, missions).
type HTTPConfig struct {
	Listen string `toml:"listen"` // "" disables it
	// Token protects the API; "" leaves it open (only sensible on loopback).
	Token     string `toml:"token"`
	TokenFile string `toml:"token_file"`
	// CertFile and KeyFile make the API HTTPS.
	CertFile string `toml:"cert_file"`
	KeyFile  string `toml:"key_file"`
}

// LogConfig sets level (debug, info, warn, error) and format (text, json).
type LogConfig struct {
	Level  string `toml:"level"`
	Format string `toml:"format"`
}

// DriverConfig tunes the mission loop.
type DriverConfig struct {
	Workers     int             `toml:"workers"`
	StepTimeout driver.Duration `toml:"step_timeout"`
	StopGrace   driver.Duration `toml:"stop_grace"`
	MaxLive     int             `toml:"max_live"`
}

// SimulatorConfig runs a simulated home inside the agent (the demo).
type SimulatorConfig struct {
	Home string `toml:"home"` // "" disables it
}

// HomeAssistantConfig is [homeassistant]: the scenes announced through
// Home Assistant's MQTT discovery (docs/devices.md).
type HomeAssistantConfig struct {
	Discovery bool   `toml:"discovery"`
	Prefix    string `toml:"prefix"`
}

// HubConfig connects the agent to a hub (store-and-forward sync).
type HubConfig struct {
	URL string `toml:"url"` // "" (and no urls) disables sync
	// URLs are more addresses of the same hub (the nodes of a cluster),
	// tried in turn after URL.
	URLs []string `toml:"urls"`
	// ClientID defaults to "sortie-gw-" + the gateway ID.
	ClientID string `toml:"client_id"`
	// RetainStatus publishes the gateway's status retained (default):
	// false for a hub in the cluster mode.
	RetainStatus bool `toml:"retain_status"`
	// Username defaults to the gateway ID, which is what the hub's ACL
	// expects.
	Username     string `toml:"username"`
	Password     string `toml:"password"`
	PasswordFile string `toml:"password_file"`
	CAFile       string `toml:"ca_file"`
	CertFile     string `toml:"cert_file"`
	KeyFile      string `toml:"key_file"`
	Insecure     bool   `toml:"insecure_skip_verify"`
	Prefix       string `toml:"prefix"`
	// OutboxMax bounds the events kept for the hub while it is
	// unreachable; past it, each mission keeps only its latest event.
	OutboxMax int             `toml:"outbox_max"`
	Heartbeat driver.Duration `toml:"heartbeat"`
}

// addrs is every address of the hub, url first; none disables sync.
func (h HubConfig) addrs() []string {
	var out []string
	if h.URL != "" {
		out = append(out, h.URL)
	}
	return append(out, h.URLs...)
}

// broker views the hub connection settings as a BrokerConfig, to share
// the TLS and password handling.
func (h HubConfig) broker() BrokerConfig {
	return BrokerConfig{
		URL: h.URL, Username: h.Username, Password: h.Password, PasswordFile: h.PasswordFile,
		CAFile: h.CAFile, CertFile: h.CertFile, KeyFile: h.KeyFile, Insecure: h.Insecure,
	}
}

// RetentionConfig bounds how many finished missions are kept.
type RetentionConfig struct {
	MaxAge   driver.Duration `toml:"max_age"`
	MaxCount int             `toml:"max_count"`
	MaxBytes conf.Bytes      `toml:"max_bytes"`
	Interval driver.Duration `toml:"interval"`
}

// TracesConfig bounds the record of every trigger the agent answered
// ("agent why").
type TracesConfig struct {
	MaxAge       driver.Duration `toml:"max_age"`
	FailedMaxAge driver.Duration `toml:"failed_max_age"`
	MaxBytes     conf.Bytes      `toml:"max_bytes"`
}

// BundlesConfig is [bundles]: how long a configuration bundle applied
// ("agent apply", or the hub's) stays on trial (docs/fleet.md).
type BundlesConfig struct {
	Soak            driver.Duration `toml:"soak"`
	Confirm         driver.Duration `toml:"confirm"`
	ValidateTimeout driver.Duration `toml:"validate_timeout"`
}

// LocationConfig places the gateway for sun schedules ([location]). It
// is the setting a configuration bundle may carry, so its type and rules
// are the bundle's.
type LocationConfig = bundle.Location

// DefaultConfig is what an empty file means.
func DefaultConfig() Config {
	return Config{
		GatewayID: "home",
		DataDir:   "data",
		Devices:   "devices.toml",
		Scenes:    "scenes",
		Broker: BrokerConfig{
			Embedded:   true,
			Listen:     "127.0.0.1:1883",
			Prefix:     wire.DefaultPrefix,
			AckTimeout: driver.Duration(2 * time.Second),
		},
		HTTP:   HTTPConfig{Listen: "127.0.0.1:8080"},
		Hub:    HubConfig{Prefix: "sortie", OutboxMax: 10000, Heartbeat: driver.Duration(30 * time.Second), RetainStatus: true},
		Log:    LogConfig{Level: "info", Format: "text"},
		Driver: DriverConfig{Workers: 16, StepTimeout: driver.Duration(10 * time.Second), StopGrace: driver.Duration(10 * time.Second), MaxLive: 500},
		Retention: RetentionConfig{
			MaxAge: driver.Duration(30 * 24 * time.Hour), MaxCount: 10000, MaxBytes: 64 << 20, Interval: driver.Duration(10 * time.Minute),
		},
		Traces: TracesConfig{
			MaxAge: driver.Duration(7 * 24 * time.Hour), FailedMaxAge: driver.Duration(30 * 24 * time.Hour), MaxBytes: 4 << 20,
		},
		HomeAssistant: HomeAssistantConfig{Prefix: "homeassistant"},
		Bundles:       BundlesConfig{Soak: driver.Duration(time.Minute), Confirm: driver.Duration(5 * time.Minute), ValidateTimeout: driver.Duration(10 * time.Second)},
	}
}

// ConfigError names the file and field of a bad setting.
type ConfigError = conf.Error

// LoadConfig reads path over the defaults, rejecting unknown keys.
// An empty path means defaults relative to the working directory.
func LoadConfig(path string) (Config, error) {
	cfg := DefaultConfig()
	cfg.Dir = "."
	if path == "" {
		return cfg, nil
	}
	cfg.Dir = filepath.Dir(path)
	if err := conf.Decode(path, &cfg); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// Path resolves a path from the config file against its directory.
func (c Config) Path(p string) string {
	return conf.Resolve(c.Dir, p)
}

// Validate checks every field and names every bad one, one per line.
func (c Config) Validate(file string) error {
	p := &problems{file: file}
	bad := p.add
	if err := driver.CheckID("gateway_id", c.GatewayID); err != nil {
		bad("gateway_id", "%v", err)
	}
	if c.DataDir == "" {
		bad("data_dir", "must be set")
	}
	if c.Devices == "" {
		bad("devices", "must be set")
	}
	if c.Scenes == "" {
		bad("scenes", "must be set")
	}
	b := c.Broker
	if b.Embedded {
		if _, _, err := net.SplitHostPort(b.Listen); err != nil {
			bad("broker.listen", "%q is not host:port: %v", b.Listen, err)
		}
	} else {
		u, err := url.Parse(b.URL)
		switch {
		case err != nil || u.Host == "":
			bad("broker.url", "%q is not a broker URL like tcp://host:1883", b.URL)
		case !slices.Contains([]string{"tcp", "mqtt", "ssl", "tls", "mqtts", "ws", "wss"}, u.Scheme):
			bad("broker.url", "scheme %q not supported (tcp, ssl, tls, mqtts, ws, wss)", u.Scheme)
		}
	}
	if b.Prefix == "" || strings.ContainsAny(b.Prefix, "+#") || strings.HasPrefix(b.Prefix, "/") || strings.HasSuffix(b.Prefix, "/") {
		bad("broker.prefix", "%q must be non-empty, without wildcards or a leading/trailing '/'", b.Prefix)
	}
	if (b.CertFile == "") != (b.KeyFile == "") {
		bad("broker.cert_file", "cert_file and key_file go together")
	}
	if b.AckTimeout <= 0 {
		bad("broker.ack_timeout", "must be positive")
	}
	if len(b.Users) > 0 && !b.Embedded {
		bad("broker.users", "apply to the embedded broker; an external broker has its own")
	}
	if (b.ServerCertFile == "") != (b.ServerKeyFile == "") {
		bad("broker.server_cert_file", "server_cert_file and server_key_file go together")
	} else if b.ServerCertFile != "" && !b.Embedded {
		bad("broker.server_cert_file", "applies to the embedded broker (for an external one, see ca_file)")
	}
	for _, e := range agent.CheckUsers(BrokerUsers(b)) {
		bad(fmt.Sprintf("broker.users[%d].%s", e.Index, e.Field), "%s", e.Msg)
	}
	if c.HTTP.Listen != "" {
		if _, _, err := net.SplitHostPort(c.HTTP.Listen); err != nil {
			bad("http.listen", "%q is not host:port: %v", c.HTTP.Listen, err)
		}
	}
	if (c.HTTP.CertFile == "") != (c.HTTP.KeyFile == "") {
		bad("http.cert_file", "cert_file and key_file go together")
	}
	if c.HTTP.Token != "" && c.HTTP.TokenFile != "" {
		bad("http.token_file", "set either http.token or http.token_file, not both")
	}
	if c.HTTP.TokenFile != "" {
		if _, err := os.Stat(c.Path(c.HTTP.TokenFile)); err != nil {
			bad("http.token_file", "%v", err)
		}
	}
	if _, err := ParseLevel(c.Log.Level); err != nil {
		bad("log.level", "%v", err)
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		bad("log.format", "%q must be \"text\" or \"json\"", c.Log.Format)
	}
	if c.Driver.Workers < 1 || c.Driver.Workers > 1024 {
		bad("driver.workers", "%d must be between 1 and 1024", c.Driver.Workers)
	}
	if c.Driver.MaxLive < 0 {
		bad("driver.max_live", "%d must be 0 (no bound) or more", c.Driver.MaxLive)
	}
	if c.Driver.StepTimeout <= 0 {
		bad("driver.step_timeout", "must be positive")
	}
	if c.Driver.StopGrace <= 0 {
		bad("driver.stop_grace", "must be positive")
	}
	if c.Hub.URL != "" {
		if u, err := url.Parse(c.Hub.URL); err != nil || u.Host == "" {
			bad("hub.url", "%q is not a broker URL like tcp://hub:1883", c.Hub.URL)
		}
	}
	for i, a := range c.Hub.URLs {
		if u, err := url.Parse(a); err != nil || u.Host == "" {
			bad(fmt.Sprintf("hub.urls[%d]", i), "%q is not a broker URL like tcp://nats-1:1883", a)
		}
	}
	if len(c.Hub.addrs()) > 0 {
		if (c.Hub.CertFile == "") != (c.Hub.KeyFile == "") {
			bad("hub.cert_file", "cert_file and key_file go together")
		}
		if c.Hub.Prefix == "" || strings.ContainsAny(c.Hub.Prefix, "+#") {
			bad("hub.prefix", "%q must be non-empty and without wildcards", c.Hub.Prefix)
		}
		if c.Hub.ClientID != "" {
			if err := driver.ValidateID("client id", c.Hub.ClientID); err != nil {
				bad("hub.client_id", "%v", err)
			}
		}
		if c.Hub.Heartbeat <= 0 {
			bad("hub.heartbeat", "must be positive")
		}
	}
	if c.Retention.MaxCount < 0 {
		bad("retention.max_count", "must not be negative")
	}
	if c.Retention.MaxBytes != 0 && c.Retention.MaxBytes < 1<<20 {
		bad("retention.max_bytes", "%s is below 1MiB (0 disables it)", c.Retention.MaxBytes)
	}
	if c.Traces.MaxAge <= 0 || c.Traces.FailedMaxAge <= 0 {
		bad("traces.max_age", "max_age and failed_max_age must be positive")
	}
	if c.Traces.MaxBytes < 64<<10 {
		bad("traces.max_bytes", "%s is below 64KiB", c.Traces.MaxBytes)
	} else if c.Retention.MaxBytes != 0 && c.Traces.MaxBytes > c.Retention.MaxBytes/2 {
		bad("traces.max_bytes", "%s is more than half of retention.max_bytes (%s), which counts it", c.Traces.MaxBytes, c.Retention.MaxBytes)
	}
	if p := c.HomeAssistant.Prefix; p == "" || strings.ContainsAny(p, "+#") || strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/") {
		bad("homeassistant.prefix", "%q is not a topic prefix (no wildcards, no leading or trailing '/')", p)
	}
	if c.Bundles.Soak <= 0 || c.Bundles.Confirm <= 0 || c.Bundles.ValidateTimeout <= 0 {
		bad("bundles.soak", "soak, confirm and validate_timeout must be positive")
	}
	for _, p := range c.Location.Problems() {
		bad(p.Field, "%s", p.Msg)
	}
	return errors.Join(p.errs...)
}

// problems collects what Validate finds.
type problems struct {
	file string
	errs []error
}

// add is kept out of line: inlined at Validate's fifty checks it made
// that one function 15 KB of the gateway's binary.
//
//go:noinline
func (p *problems) add(field, format string, args ...any) {
	p.errs = append(p.errs, &ConfigError{File: p.file, Field: field, Msg: fmt.Sprintf(format, args...)})
}

func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("%q is not one of debug, info, warn, error", s)
	}
	return l, nil
}

// tlsConfig builds the broker TLS settings, or nil when none are set.
func (b BrokerConfig) tlsConfig(c Config) (*tls.Config, error) {
	tc, err := conf.ClientTLS(c.Path(b.CAFile), c.Path(b.CertFile), c.Path(b.KeyFile), b.Insecure)
	if err != nil {
		return nil, fmt.Errorf("broker.%w", err)
	}
	return tc, nil
}

// ServerTLS is the embedded broker's TLS setup, and a client setup for
// the agent's own clients (conf.PinnedTLS); nil without a certificate.
func (b BrokerConfig) ServerTLS(c Config) (server, self *tls.Config, err error) {
	if b.ServerCertFile == "" {
		return nil, nil, nil
	}
	server, self, err = conf.PinnedTLS(c.Path(b.ServerCertFile), c.Path(b.ServerKeyFile))
	if err != nil {
		return nil, nil, fmt.Errorf("broker.server_cert_file, broker.server_key_file: %w", err)
	}
	return server, self, nil
}

// ServerTLS is the HTTP API's TLS setup, and a client setup for the
// agent's own command line (conf.PinnedTLS); nil without a certificate.
func (h HTTPConfig) ServerTLS(c Config) (server, self *tls.Config, err error) {
	if h.CertFile == "" {
		return nil, nil, nil
	}
	server, self, err = conf.PinnedTLS(c.Path(h.CertFile), c.Path(h.KeyFile))
	if err != nil {
		return nil, nil, fmt.Errorf("http.cert_file, http.key_file: %w", err)
	}
	return server, self, nil
}

// password returns the broker password, reading password_file if set.
func (b BrokerConfig) password(c Config) (string, error) {
	p, err := conf.Secret(b.Password, c.Path(b.PasswordFile))
	if err != nil {
		return "", fmt.Errorf("broker.password_file: %w", err)
	}
	return p, nil
}

// BrokerUsers are the embedded broker's users as the agent takes them.
func BrokerUsers(b BrokerConfig) []agent.BrokerUser {
	out := make([]agent.BrokerUser, 0, len(b.Users))
	for _, u := range b.Users {
		out = append(out, agent.BrokerUser{Name: u.Name, Role: u.Role, PasswordHash: u.PasswordHash, Scope: u.Scope})
	}
	return out
}
