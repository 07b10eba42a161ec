//go:build nosim

package agent

import (
	"context"
	"errors"
)

// HomeConfig stands for a simulated home's configuration in a build
// without the simulator (-tags nosim): Options.Home must stay nil.
type HomeConfig struct{}

// homeRef is the running simulated home: none here.
type homeRef = struct{}

// SimulatorBuiltIn says whether this build can run a simulated home.
const SimulatorBuiltIn = false

// ErrNoSimulator is why a build without the simulator runs no home.
var ErrNoSimulator = errors.New("this agent is built without the simulator (-tags nosim): [simulator] home is for the demo; run `sim` beside it, or a build without the tag")

func (a *Agent) startHome(context.Context, HomeConfig, homeConn) error { return ErrNoSimulator }
