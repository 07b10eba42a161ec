package agent

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/devices/wire"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/scenes"
)

// Options configures an Agent. The zero value of each optional field
// takes the default its comment gives; cmd/agent maps its config file
// onto these.
type Options struct {
	// Gateway names this gateway in topics, events and the hub. Required.
	Gateway string
	// DataDir holds the mission database (missions.db). Required.
	DataDir string
	// Registry is the device registry and Catalog the scenes built on
	// it. Required.
	Registry *devices.Registry
	Catalog  *scenes.Catalog

	// Broker is required: Embedded, or an external broker's URL.
	Broker    BrokerOptions
	HTTP      HTTPOptions
	Driver    DriverOptions
	Retention RetentionOptions
	Traces    TraceOptions
	// Hub, when set, syncs mission events to a hub and takes its
	// control requests.
	Hub *HubOptions
	// HomeAssistant, when set, announces the scenes to Home Assistant
	// (a button to run each, a sensor with its last run).
	HomeAssistant *HomeAssistantOptions
	// Bundles, when set, lets the agent take configuration bundles and
	// run them without a restart (BundleOptions); Registry, Catalog and
	// Location are then what the config files say, and a bundle applied
	// before the start replaces them.
	Bundles *BundleOptions
	// Location places the gateway for sun schedules and names its time
	// zone; required when a scene has a sun schedule.
	Location *LocationOptions
	// Clock tells the schedules and the trace records the time (default
	// the system clock); tests inject their own.
	Clock driver.Clock
	// Home, when set, runs a simulated home inside the agent (the demo).
	// Its broker, login and prefix are filled in by the agent.
	Home *HomeConfig

	// Logger receives the agent's logs; nil discards them.
	Logger *slog.Logger
	// Observers see every mission event after the agent's own (a
	// progress view, say). Each must not block: it runs on the driver's
	// commit path.
	Observers []driver.Observer
	// Handlers add step kinds, or replace the built-in ones (devices'
	// and scenes' kinds), for an embedder with steps of its own or a
	// test that stands in for the devices.
	Handlers map[string]driver.Handler
	// QuietMissions leaves out the one log line per meaningful mission
	// transition, for when an Observer already says as much.
	QuietMissions bool
	// Version is reported in logs and to the hub.
	Version string
	// Revision is the VCS revision the agent was built from, for
	// sortie_build_info; "" reads as unknown.
	Revision string
	// DemoTrigger, when set, is a scene the agent triggers through its
	// own trigger topic once it runs, as an app would.
	DemoTrigger string
	// OverTCP makes the agent reach its embedded broker over TCP, as it
	// does an external one, instead of by function call; benchmarks
	// compare the two.
	OverTCP bool
}

// BrokerOptions says which MQTT broker devices and apps use.
type BrokerOptions struct {
	// Embedded runs a broker inside the agent on Listen (default
	// 127.0.0.1:1883), speaking TLS with ServerTLS when set.
	Embedded  bool
	Listen    string
	ServerTLS *tls.Config
	// Users may connect to the embedded broker, each confined to its
	// role's topics; none lets every client in.
	Users []BrokerUser

	// URL is the external broker when Embedded is false; Username,
	// Password and TLS are the agent's login there. With an embedded
	// broker, TLS is what the agent's own TCP clients trust (its own
	// certificate).
	URL      string
	Username string
	Password string
	TLS      *tls.Config

	// Prefix is the topic prefix for devices, triggers and events
	// (default wire.DefaultPrefix).
	Prefix string
	// AckTimeout is how long a command waits for its ack unless a step
	// says otherwise (default 2s).
	AckTimeout time.Duration
}

// HTTPOptions is the management API (health, metrics, missions, scenes).
type HTTPOptions struct {
	// Listen is its address; "" disables it.
	Listen string
	// Token protects it; "" leaves it open (sensible on loopback only).
	Token string
	// TLS, when set, makes it HTTPS.
	TLS *tls.Config
}

// DriverOptions tunes the mission loop (see driver.Options).
type DriverOptions struct {
	Workers     int
	StepTimeout time.Duration
	// StopGrace bounds how long steps in flight may finish at shutdown.
	StopGrace time.Duration
	// MaxLive bounds the missions live at once (driver.Options.MaxLive):
	// a trigger beyond it is rejected as overloaded. Zero: no bound.
	MaxLive int
}

// RetentionOptions bounds the finished missions kept. A mission is
// deleted when older than MaxAge, when more than MaxCount finished
// missions are stored, or while the store's data is over MaxBytes
// (oldest first). Checked every Interval; zero Interval, or every bound
// zero, keeps everything. MaxBytes prunes to 90% of it. After deleting,
// the store gives space back to the file system (store.DB.Reclaim) when
// half its file or more is free, or the file is over MaxBytes with a
// quarter free.
type RetentionOptions struct {
	MaxAge   time.Duration
	MaxCount int
	MaxBytes int64
	Interval time.Duration
}

// TraceOptions bound the record the agent keeps of every trigger it
// answers (Agent.Why). A record whose latest evaluation failed (a
// rejection, a skipped firing) is kept FailedMaxAge, the others MaxAge,
// and all of them within MaxBytes of the store (part of
// Retention.MaxBytes), the oldest that did not fail going first.
type TraceOptions struct {
	MaxAge       time.Duration // default 7 days
	FailedMaxAge time.Duration // default 30 days
	MaxBytes     int64         // default 4 MiB
	// FlushInterval is how long a record may wait to be written with
	// others (default 2s): one write per batch spares the flash.
	FlushInterval time.Duration
}

// HubOptions connects the agent to a hub (store-and-forward sync).
type HubOptions struct {
	// URL is the hub's broker. Required.
	URL string
	// URLs are more addresses of the same hub (the nodes of a NATS
	// cluster), tried in turn after URL (hubsync.Options.Brokers).
	URLs []string
	// Username defaults to the gateway ID, which the hub's ACL expects.
	Username string
	Password string
	TLS      *tls.Config
	// ClientID is the MQTT client ID on the hub's broker; default
	// "sortie-gw-" + the gateway ID. A NATS cluster refuses a "." in it.
	ClientID string
	// NoRetain publishes the gateway's status not retained (a hub in
	// the cluster mode; see hubsync.Options.NoRetain).
	NoRetain bool
	// Prefix is the hub's topic prefix (default "sortie").
	Prefix string
	// OutboxMax bounds the events kept while the hub is unreachable;
	// past it each mission keeps only its latest event.
	OutboxMax int
	// Heartbeat is how often the inventory is sent (default 30s).
	Heartbeat time.Duration
}

// withDefaults checks the required fields and fills in the defaults.
func (o Options) withDefaults() (Options, error) {
	var errs []error
	if err := driver.ValidateID("gateway", o.Gateway); err != nil {
		errs = append(errs, err)
	}
	if o.DataDir == "" {
		errs = append(errs, errors.New("no data directory"))
	}
	if o.Registry == nil || o.Catalog == nil {
		errs = append(errs, errors.New("no device registry or scene catalog"))
	}
	if o.Bundles != nil && o.Bundles.Files == nil {
		errs = append(errs, errors.New("bundles: no bundle of the config files"))
	}
	if o.Hub != nil && o.Hub.URL == "" {
		errs = append(errs, errors.New("hub: no URL"))
	}
	if o.Broker.Embedded {
		if o.Broker.Listen == "" {
			o.Broker.Listen = "127.0.0.1:1883"
		}
		for _, e := range CheckUsers(o.Broker.Users) {
			errs = append(errs, e)
		}
		if err := CheckDeviceUsers(o.Broker.Users, o.Registry); o.Registry != nil && err != nil {
			errs = append(errs, err)
		}
	} else {
		if o.Broker.URL == "" {
			errs = append(errs, errors.New("broker: neither embedded nor a URL"))
		}
		if len(o.Broker.Users) > 0 {
			errs = append(errs, errors.New("broker: users are for the embedded broker"))
		}
	}
	if o.Catalog != nil {
		errs = append(errs, CheckLocation(o.Catalog, o.Location))
	}
	if err := errors.Join(errs...); err != nil {
		return o, fmt.Errorf("agent options: %w", err)
	}
	if o.Broker.Prefix == "" {
		o.Broker.Prefix = wire.DefaultPrefix
	}
	if o.Broker.AckTimeout <= 0 {
		o.Broker.AckTimeout = 2 * time.Second
	}
	if o.Driver.StopGrace <= 0 {
		o.Driver.StopGrace = 10 * time.Second
	}
	if o.Hub != nil {
		h := *o.Hub
		if h.Username == "" {
			h.Username = o.Gateway
		}
		if h.Heartbeat <= 0 {
			h.Heartbeat = 30 * time.Second
		}
		o.Hub = &h
	}
	if o.Clock == nil {
		o.Clock = driver.SystemClock{}
	}
	if o.Traces.MaxAge <= 0 {
		o.Traces.MaxAge = 7 * 24 * time.Hour
	}
	if o.Traces.FailedMaxAge <= 0 {
		o.Traces.FailedMaxAge = 30 * 24 * time.Hour
	}
	if o.Traces.MaxBytes <= 0 {
		o.Traces.MaxBytes = 4 << 20
	}
	if o.Traces.FlushInterval <= 0 {
		o.Traces.FlushInterval = 2 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Version == "" {
		o.Version = "dev"
	}
	return o, nil
}
