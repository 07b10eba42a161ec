package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sortie-edge/sortie/agent/hubsync"
	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/mqttc"
	"github.com/sortie-edge/sortie/scenes"
	"github.com/sortie-edge/sortie/store"
)

// httpShutdownGrace is how long the API's requests in flight get to
// finish at shutdown.
const httpShutdownGrace = 3 * time.Second

// HomeStartTimeout bounds the wait for the simulated home's devices to
// connect; they take milliseconds on a working broker, and a home that
// cannot log in (a wrong URL, a certificate it refuses) would otherwise
// hold the start forever. A variable for tests.
var HomeStartTimeout = 20 * time.Second

// Agent is one gateway's agent: the embedded broker (or a link to an
// external one), the mission store, the driver and its step handlers,
// the trigger service, the event feed, the management API and the hub
// sync, started in that order and closed in reverse.
//
// Start it, Run it until its context ends, then Close it to release
// what Start opened. Its methods are safe for concurrent use once Start
// has returned.
type Agent struct {
	opts Options
	log  *slog.Logger

	db     *store.DB
	broker *broker.Broker
	auth   *brokerAuth // the embedded broker's, when it has users
	dev    *devices.Client
	conn   link
	drv    *driver.Driver
	cat    *scenes.Catalog
	reg    *devices.Registry
	home   homeRef        // the simulated home (Options.Home), for tests
	ha     *homeAssistant // nil unless Options.HomeAssistant
	topics agentTopics
	trig   *Triggers
	traces *tracer
	sched  *scheduler
	feed   *feed
	arb    *arbiter
	cfg    *configs // nil unless Options.Bundles

	metrics *instruments
	http    *http.Server
	httpLn  net.Listener
	handler atomic.Pointer[http.Handler] // the stand-in while starting, then the API
	served  chan error                   // Serve's end
	httpWG  sync.WaitGroup
	up      *hubsync.Uplink

	// link is the agent's own connection to an external broker (nil with
	// the embedded one), and waiting what start-up waits for, if
	// anything: both for /readyz.
	link    *mqttc.Client
	waiting atomic.Pointer[func() error]

	closeMu sync.Mutex
	closers []func()

	startTimes []PhaseTime // how long each phase of Start took
	// startFault, when set (by tests), runs before each phase and fails
	// the start with its error: the seam that checks each phase's undo.
	startFault func(phase string) error
}

// New checks opts and returns an agent that Start will start.
func New(opts Options) (*Agent, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Agent{
		opts: opts, log: opts.Logger, cat: opts.Catalog, reg: opts.Registry,
		topics: newAgentTopics(opts.Broker.Prefix, opts.Gateway),
	}, nil
}

// Close stops and releases everything Start opened, in reverse order.
// It is safe to call more than once, and after a failed Start.
func (a *Agent) Close() {
	a.closeMu.Lock()
	cs := a.closers
	a.closers = nil // closed once, whoever calls first
	a.closeMu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}

func (a *Agent) onClose(f func()) {
	a.closeMu.Lock()
	a.closers = append(a.closers, f)
	a.closeMu.Unlock()
}

// Run runs the agent's loops until ctx ends, then stops them in order
// (stop taking triggers, let in-flight steps finish) and returns; Close
// then releases the rest. It starts the agent first if Start was not
// called.
func (a *Agent) Run(ctx context.Context) error {
	if a.drv == nil {
		if err := a.Start(ctx); err != nil {
			return err
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	// First thing on shutdown: stop taking steps and let those in flight
	// finish, alongside (not after) the HTTP drain and the other loops.
	g.Go(func() error {
		<-gctx.Done()
		stopCtx, cancel := context.WithTimeout(context.Background(), a.opts.Driver.StopGrace+time.Second)
		defer cancel()
		if err := a.drv.Stop(stopCtx); err != nil {
			a.log.Warn("driver stop", "err", err)
		}
		return nil
	})
	g.Go(func() error { return a.trig.Run(gctx) })
	g.Go(func() error { return a.feed.Run(gctx) })
	if a.ha != nil {
		g.Go(func() error { return a.ha.Run(gctx) })
	}
	g.Go(func() error { return a.arb.Run(gctx) })
	if a.cfg != nil {
		g.Go(func() error { return a.cfg.run(gctx) })
	}
	if a.http != nil {
		g.Go(func() error {
			select {
			case err := <-a.served:
				if err != nil {
					return fmt.Errorf("http: %w", err)
				}
			case <-gctx.Done():
			}
			return nil
		})
		g.Go(func() error {
			<-gctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), httpShutdownGrace)
			defer cancel()
			if err := a.http.Shutdown(sctx); err != nil {
				// A request still running, or a client that opened a
				// connection and sent nothing (net/http waits 5s for
				// those): neither should hold the agent's stop or make it
				// fail. What they asked is durable or will be retried.
				a.log.Warn("http: closing connections still open at shutdown", "err", err)
				_ = a.http.Close() // closing is the point; its error says no more than Shutdown's
			}
			return nil
		})
	}
	g.Go(func() error { return a.retention(gctx) })
	g.Go(func() error { return a.traces.run(gctx) })
	g.Go(func() error { return a.sched.run(gctx) })
	if a.up != nil {
		g.Go(func() error { return a.up.Run(gctx) })
	}
	if a.opts.DemoTrigger != "" {
		if err := a.selfTrigger(a.opts.DemoTrigger); err != nil {
			a.log.Error("demo trigger", "err", err)
		}
	}
	err := g.Wait()
	a.log.Info("agent stopping")
	return err
}

// selfTrigger publishes a trigger to our own topic, exercising the same
// path an app would.
func (a *Agent) selfTrigger(scene string) error {
	payload := fmt.Sprintf(`{"scene":%q,"request_id":"demo-%d","source":"demo"}`, scene, time.Now().UnixNano())
	return a.conn.Publish(a.topics.Trigger(), []byte(payload), false, 1)
}

// Addrs are where a started agent can be reached.
type Addrs struct {
	// BrokerURL is the broker devices and apps use (tcp:// or ssl://).
	BrokerURL string
	// BrokerListen is the embedded broker's bound host:port; "" with an
	// external broker.
	BrokerListen string
	// API is the management API's base URL; "" when it is disabled.
	API string
	// TriggerTopic is where apps publish triggers.
	TriggerTopic string
	// Scenes are the scenes that can be triggered.
	Scenes []string
	// BrokerUsers says whether the embedded broker asks for a login.
	BrokerUsers bool
}

// Addrs says where the started agent listens.
func (a *Agent) Addrs() Addrs {
	ad := Addrs{BrokerURL: a.opts.Broker.URL, TriggerTopic: a.topics.Trigger(), Scenes: a.catalog().Names(), BrokerUsers: a.auth != nil}
	if a.broker != nil {
		ad.BrokerURL, ad.BrokerListen = a.broker.URL(), a.broker.Addr()
	}
	if a.httpLn != nil {
		scheme := "http://"
		if a.opts.HTTP.TLS != nil {
			scheme = "https://"
		}
		ad.API = scheme + a.httpLn.Addr().String()
	}
	return ad
}

// Unfinished counts the missions a next start would go on with.
func (a *Agent) Unfinished(ctx context.Context) (int, error) {
	active, err := a.db.Active(ctx)
	return len(active), err
}

// Broker is the embedded broker, for an embedder that adds its own
// hooks or publishes in process; nil with an external broker or before
// Start.
func (a *Agent) Broker() *broker.Broker { return a.broker }

// Driver is the mission driver, for an embedder that submits, controls
// or observes missions directly; nil before Start.
func (a *Agent) Driver() *driver.Driver { return a.drv }

// dialDevices connects the devices client. A broker that is not up yet
// or refuses the connection is tried again, for as long as ctx lasts,
// with the cause logged once and shown in /readyz: a gateway whose
// broker starts after it, or comes back after it, waits instead of
// exiting. Invalid options end the start.
func (a *Agent) dialDevices(ctx context.Context, o devices.Options) (*devices.Client, error) {
	var logged string
	for {
		dev, err := devices.Dial(ctx, o)
		if err == nil || o.Local != nil || errors.Is(err, mqttc.ErrOptions) || ctx.Err() != nil {
			a.waitFor(nil)
			return dev, err
		}
		a.waitFor(func() error { return fmt.Errorf("devices: %w", err) })
		if err.Error() != logged {
			logged = err.Error()
			a.log.Warn("cannot connect to the broker for the devices; retrying until it answers", "err", err)
		}
		// Dial itself retried for its ConnectTimeout: a pause, then again.
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

// waitFor records what start-up waits for (nil: nothing), for /readyz.
func (a *Agent) waitFor(why func() error) {
	if why == nil {
		a.waiting.Store(nil)
		return
	}
	a.waiting.Store(&why)
}

// waitingFor says what start-up waits for; nil when nothing.
func (a *Agent) waitingFor() error {
	if f := a.waiting.Load(); f != nil {
		return (*f)()
	}
	return nil
}

// linkProblem says why the link to an external broker is not up; nil
// when it is, or with the embedded broker.
func (a *Agent) linkProblem() error {
	if a.link == nil {
		return nil
	}
	return a.link.Problem()
}
