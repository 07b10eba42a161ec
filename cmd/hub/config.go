package main

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/hub"
	"github.com/sortie-edge/sortie/internal/conf"
	"github.com/sortie-edge/sortie/uplink"
)

// Config is the hub's configuration file (configs/hub.toml).
type Config struct {
	// DataDir holds the hub's database (hub.db).
	DataDir string `toml:"data_dir"`
	// Prefix is the root of the uplink topics; it must match the gateways'.
	Prefix string `toml:"prefix"`

	Broker    BrokerConfig    `toml:"broker"`
	Cluster   ClusterConfig   `toml:"cluster"`
	Identity  IdentityConfig  `toml:"identity"`
	HTTP      HTTPConfig      `toml:"http"`
	Retention RetentionConfig `toml:"retention"`
	Presence  PresenceConfig  `toml:"presence"`
	Log       LogConfig       `toml:"log"`

	// Gateways maps each gateway ID (its MQTT user name) to a password
	// hash printed by "hub passwd". Only the embedded broker uses them.
	Gateways map[string]string `toml:"gateways"`

	// dir is the config file's directory; relative paths resolve from it.
	dir string
}

// BrokerConfig says where gateways connect.
type BrokerConfig struct {
	// Embedded runs a mochi broker with the hub's ACL on Listen.
	Embedded bool   `toml:"embedded"`
	Listen   string `toml:"listen"`
	// CertFile and KeyFile make the embedded broker speak TLS.
	CertFile string `toml:"cert_file"`
	KeyFile  string `toml:"key_file"`
	// URL is an external broker, used when Embedded is false; its ACL
	// is then its own business (see docs/hub.md).
	URL      string `toml:"url"`
	CAFile   string `toml:"ca_file"`
	Insecure bool   `toml:"insecure_skip_verify"`
}

// ClusterConfig is the cluster mode (docs/cluster.md): the gateways
// connect to a NATS cluster's MQTT, and every hub replica shares one
// PostgreSQL database. [broker] and data_dir are then unused, and the
// gateways' credentials live in NATS.
type ClusterConfig struct {
	Enabled bool `toml:"enabled"`
	// NATS is the servers' client URLs, comma separated.
	NATS string `toml:"nats"`
	// NATSUser and NATSPassword (or NATSPasswordFile) are the hub's NATS
	// identity.
	NATSUser         string `toml:"nats_user"`
	NATSPassword     string `toml:"nats_password"`
	NATSPasswordFile string `toml:"nats_password_file"`
	// NATSCAFile, when set, makes the hub speak TLS to NATS, trusting it.
	NATSCAFile string `toml:"nats_ca_file"`
	// Postgres (or PostgresFile, which keeps the password out of the
	// config) is the database's connection string.
	Postgres     string `toml:"postgres"`
	PostgresFile string `toml:"postgres_file"`
	// Replicas of the streams (1, 3 or 5).
	Replicas int `toml:"replicas"`
	// MaxAge and MaxBytes bound the uplink stream (a hub outage).
	MaxAge   driver.Duration `toml:"max_age"`
	MaxBytes int64           `toml:"max_bytes"`
	// AckWait is how long a replica may hold a message before another
	// gets it.
	AckWait driver.Duration `toml:"ack_wait"`
	// MovedControlResend is control_resend's old place: set, it is an
	// error that says where it went.
	MovedControlResend driver.Duration `toml:"control_resend" json:"-"`
	// MaxAckPending bounds the messages the replicas hold unacknowledged
	// between them; Fetch is how many a replica asks for at a time. Both
	// apply when the consumer is created.
	MaxAckPending int `toml:"max_ack_pending"`
	Fetch         int `toml:"fetch"`
}

// IdentityConfig is the hub's own MQTT identity.
type IdentityConfig struct {
	Username string `toml:"username"`
	// Password (or PasswordFile) is required for an external broker. For
	// the embedded broker, empty means a random one per run: only the
	// hub itself ever uses it.
	Password     string `toml:"password"`
	PasswordFile string `toml:"password_file"`
	ClientID     string `toml:"client_id"`
}

// HTTPConfig is the API and dashboard.
type HTTPConfig struct {
	Listen string `toml:"listen"`
	// Token (or TokenFile, or $SORTIE_HUB_TOKEN) is the API bearer token.
	Token     string `toml:"token"`
	TokenFile string `toml:"token_file"`
	// ControlTimeout bounds the wait for a gateway's control result;
	// ControlResend is how often the request is sent again meanwhile (to
	// gateways of protocol 2, which take it at QoS 0).
	ControlTimeout driver.Duration `toml:"control_timeout"`
	ControlResend  driver.Duration `toml:"control_resend"`
}

// RetentionConfig bounds how many finished missions, and ended
// rollouts, are kept.
type RetentionConfig struct {
	MaxAge           driver.Duration `toml:"max_age"`
	MaxCount         int             `toml:"max_count"`
	Interval         driver.Duration `toml:"interval"`
	RolloutsMaxAge   driver.Duration `toml:"rollouts_max_age"`
	RolloutsPerGroup int             `toml:"rollouts_per_group"`
}

// PresenceConfig says when a gateway is shown offline without having
// said so.
type PresenceConfig struct {
	// OfflineAfter is how long a gateway may go unheard (heartbeats
	// included) before it is marked offline.
	OfflineAfter driver.Duration `toml:"offline_after"`
}

// LogConfig sets level (debug, info, warn, error) and format (text, json).
type LogConfig struct {
	Level  string `toml:"level"`
	Format string `toml:"format"`
}

// tokenEnv overrides the token from the file, to keep it out of files.
const tokenEnv = "SORTIE_HUB_TOKEN"

// minToken is the shortest API token accepted.
const minToken = 16

// DefaultConfig is what an empty file means.
func DefaultConfig() Config {
	return Config{
		DataDir: "data/hub",
		Prefix:  uplink.DefaultPrefix,
		Broker:  BrokerConfig{Embedded: true, Listen: "127.0.0.1:1884"},
		Identity: IdentityConfig{
			Username: "hub",
			ClientID: "sortie-hub",
		},
		HTTP: HTTPConfig{Listen: "127.0.0.1:8090", ControlTimeout: driver.Duration(10 * time.Second), ControlResend: driver.Duration(2 * time.Second)},
		Retention: RetentionConfig{
			MaxAge: driver.Duration(30 * 24 * time.Hour), MaxCount: 100_000, Interval: driver.Duration(time.Hour),
			RolloutsMaxAge: driver.Duration(90 * 24 * time.Hour), RolloutsPerGroup: 50,
		},
		Presence: PresenceConfig{OfflineAfter: driver.Duration(90 * time.Second)},
		Log:      LogConfig{Level: "info", Format: "text"},
		Gateways: map[string]string{},
		Cluster: ClusterConfig{
			NATSUser: "hub", Replicas: 3, MaxAge: driver.Duration(7 * 24 * time.Hour), MaxBytes: 1 << 30,
			AckWait:       driver.Duration(30 * time.Second),
			MaxAckPending: 8192, Fetch: 512,
		},
	}
}

// ConfigError names the file and field of a bad setting.
type ConfigError = conf.Error

// LoadConfig decodes path over the defaults and rejects unknown keys.
// An empty path means the defaults.
func LoadConfig(path string) (Config, error) {
	cfg := DefaultConfig()
	cfg.dir = "."
	if path == "" {
		return cfg, nil
	}
	cfg.dir = filepath.Dir(path)
	if err := conf.Decode(path, &cfg); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// path resolves p against the config file's directory.
func (c Config) path(p string) string {
	return conf.Resolve(c.dir, p)
}

// Validate checks every field and names the first bad one.
func (c Config) Validate(file string) error {
	bad := func(field, format string, args ...any) error {
		return &ConfigError{File: file, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	hostPort := func(field, v string) error {
		if _, _, err := net.SplitHostPort(v); err != nil {
			return bad(field, "%q is not host:port", v)
		}
		return nil
	}
	if c.Cluster.Enabled {
		if err := c.Cluster.validate(bad); err != nil {
			return err
		}
	} else if c.DataDir == "" {
		return bad("data_dir", "must be set")
	}
	if c.Prefix == "" || strings.ContainsAny(c.Prefix, "+#") || strings.HasPrefix(c.Prefix, "/") || strings.HasSuffix(c.Prefix, "/") {
		return bad("prefix", "%q must be non-empty, without wildcards or a leading/trailing '/'", c.Prefix)
	}
	if c.Cluster.MovedControlResend != 0 {
		return bad("cluster.control_resend", "moved to [http] control_resend (it applies to both modes)")
	}
	if k := c.Cluster; !k.Enabled && (k.NATS != "" || k.Postgres != "" || k.PostgresFile != "" || k.NATSPassword != "" || k.NATSPasswordFile != "") {
		return bad("cluster.enabled", "[cluster] is filled in but not enabled: add enabled = true for the cluster mode, or remove [cluster] for the single hub")
	}
	b := c.Broker
	switch {
	case c.Cluster.Enabled:
		// The gateways connect to NATS; [broker] is not used.
	case b.Embedded:
		if err := hostPort("broker.listen", b.Listen); err != nil {
			return err
		}
		if (b.CertFile == "") != (b.KeyFile == "") {
			return bad("broker.cert_file", "cert_file and key_file go together")
		}
	default:
		u, err := url.Parse(b.URL)
		if err != nil || u.Host == "" || !slices.Contains([]string{"tcp", "mqtt", "ssl", "tls", "mqtts", "ws", "wss"}, u.Scheme) {
			return bad("broker.url", "%q is not a broker URL like tcp://host:1883 or ssl://host:8883", b.URL)
		}
		if c.Identity.Password == "" && c.Identity.PasswordFile == "" {
			return bad("identity.password", "an external broker needs the hub's password (or identity.password_file)")
		}
	}
	if err := driver.CheckID("identity.username", c.Identity.Username); err != nil {
		return bad("identity.username", "%v", err)
	}
	if c.Identity.ClientID == "" {
		return bad("identity.client_id", "must be set")
	}
	for id, h := range c.Gateways {
		if err := driver.CheckID("gateway", id); err != nil {
			return bad("gateways."+id, "%v", err)
		}
		if id == c.Identity.Username {
			return bad("gateways."+id, "a gateway cannot use the hub's user name")
		}
		if err := hub.ParseHash(h); err != nil {
			return bad("gateways."+id, "%v", err)
		}
	}
	if b.Embedded && !c.Cluster.Enabled && len(c.Gateways) == 0 {
		return bad("gateways", "no gateway credentials: add some with \"hub passwd\"")
	}
	if err := hostPort("http.listen", c.HTTP.Listen); err != nil {
		return err
	}
	if c.HTTP.ControlTimeout <= 0 {
		return bad("http.control_timeout", "must be positive")
	}
	if c.HTTP.ControlResend <= 0 || c.HTTP.ControlResend >= c.HTTP.ControlTimeout {
		return bad("http.control_resend", "%s must be positive and shorter than control_timeout (%s)", c.HTTP.ControlResend, c.HTTP.ControlTimeout)
	}
	if c.Retention.MaxCount < 0 {
		return bad("retention.max_count", "must not be negative")
	}
	if c.Retention.Interval <= 0 {
		return bad("retention.interval", "must be positive")
	}
	if c.Retention.RolloutsMaxAge <= 0 || c.Retention.RolloutsPerGroup < 1 {
		return bad("retention", "rollouts_max_age must be positive and rollouts_per_group at least 1")
	}
	if c.Presence.OfflineAfter < driver.Duration(time.Second) {
		return bad("presence.offline_after", "%s is too short: at least 1s, and longer than the gateways' heartbeat (two or three of them)", c.Presence.OfflineAfter)
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.Log.Level)); err != nil {
		return bad("log.level", "%q is not one of debug, info, warn, error", c.Log.Level)
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		return bad("log.format", "%q must be \"text\" or \"json\"", c.Log.Format)
	}
	return nil
}

func (c ClusterConfig) validate(bad func(field, format string, args ...any) error) error {
	if c.NATS == "" {
		return bad("cluster.nats", "the NATS servers' URLs are needed, like nats://10.0.0.1:4222,nats://10.0.0.2:4222")
	}
	for u := range strings.SplitSeq(c.NATS, ",") {
		pu, err := url.Parse(strings.TrimSpace(u))
		if err != nil || pu.Host == "" || !slices.Contains([]string{"nats", "tls"}, pu.Scheme) {
			return bad("cluster.nats", "%q is not a NATS URL like nats://host:4222", u)
		}
	}
	if c.NATSUser == "" || c.NATSPassword == "" && c.NATSPasswordFile == "" {
		return bad("cluster.nats_user", "the hub's NATS user and password (or nats_password_file) are needed")
	}
	if c.Postgres == "" && c.PostgresFile == "" {
		return bad("cluster.postgres", "the PostgreSQL connection string (or postgres_file) is needed")
	}
	if !slices.Contains([]int{1, 3, 5}, c.Replicas) {
		return bad("cluster.replicas", "%d: want 1, 3 or 5", c.Replicas)
	}
	if c.MaxAge <= 0 || c.MaxBytes <= 0 {
		return bad("cluster.max_age", "max_age and max_bytes must be positive")
	}
	if c.AckWait < driver.Duration(time.Second) {
		return bad("cluster.ack_wait", "%s: must be at least 1s", c.AckWait)
	}
	if c.MaxAckPending < 1 || c.Fetch < 1 || c.Fetch > c.MaxAckPending {
		return bad("cluster.fetch", "fetch (%d) and max_ack_pending (%d) must be positive, fetch at most max_ack_pending", c.Fetch, c.MaxAckPending)
	}
	return nil
}

// secret returns an inline value, else the trimmed contents of file.
func (c Config) secret(inline, file string) (string, error) {
	v, err := conf.Secret(inline, c.path(file))
	if err != nil {
		return "", fmt.Errorf("read secret: %w", err)
	}
	return v, nil
}

// token is the API token: $SORTIE_HUB_TOKEN, http.token or http.token_file.
func (c Config) token() (string, error) {
	t := os.Getenv(tokenEnv)
	if t == "" {
		var err error
		if t, err = c.secret(c.HTTP.Token, c.HTTP.TokenFile); err != nil {
			return "", fmt.Errorf("http.token_file: %w", err)
		}
	}
	if len(t) < minToken {
		return "", &ConfigError{File: "config", Field: "http.token", Msg: fmt.Sprintf("the API token must be at least %d characters (set http.token, http.token_file or $%s)", minToken, tokenEnv)}
	}
	return t, nil
}

// serverTLS loads the embedded broker's certificate, and a client
// setup that trusts exactly it for the hub's own connection
// (conf.PinnedTLS); nil for plain TCP.
func (c Config) serverTLS() (server, self *tls.Config, err error) {
	if c.Broker.CertFile == "" {
		return nil, nil, nil
	}
	server, self, err = conf.PinnedTLS(c.path(c.Broker.CertFile), c.path(c.Broker.KeyFile))
	if err != nil {
		return nil, nil, fmt.Errorf("broker.cert_file: %w", err)
	}
	return server, self, nil
}

// clientTLS is how the hub's own client trusts an external broker.
func (c Config) clientTLS() (*tls.Config, error) {
	tc, err := conf.ClientTLS(c.path(c.Broker.CAFile), "", "", c.Broker.Insecure)
	if err != nil {
		return nil, fmt.Errorf("broker.%w", err)
	}
	if tc == nil {
		tc = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return tc, nil
}
