//go:build !nosim

package agent

import (
	"context"
	"fmt"

	"github.com/sortie-edge/sortie/simulator"
)

// HomeConfig is a simulated home (Options.Home): the demo's devices,
// run inside the agent. A build with -tags nosim (the shipped ARM
// binaries, `make cross`) leaves the simulator out.
type HomeConfig = simulator.HomeConfig

// homeRef is the running simulated home.
type homeRef = *simulator.Home

// SimulatorBuiltIn says whether this build can run a simulated home.
const SimulatorBuiltIn = true

// startHome connects the simulated home's devices to the agent's broker
// and waits until they are online.
func (a *Agent) startHome(ctx context.Context, hc HomeConfig, c homeConn) error {
	hc.Broker = c.broker
	hc.Username, hc.Password, hc.TLS = c.user, c.password, c.tls
	hc.Prefix = a.opts.Broker.Prefix
	hc.Logger = a.log.With("component", "simulator")
	home, err := simulator.NewHome(hc)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeoutCause(ctx, HomeStartTimeout, fmt.Errorf("not online within %s", HomeStartTimeout))
	err = home.Start(sctx)
	cancel()
	if err != nil {
		// Its devices that did connect are still running.
		_ = home.Close() // the start has failed already; this only stops them
		return fmt.Errorf("simulated home: %w", err)
	}
	a.home = home
	a.onClose(func() { _ = home.Close() }) // the demo's devices saying goodbye: nothing to act on
	a.log.Info("simulated home running", "devices", len(home.Devices()))
	return nil
}
