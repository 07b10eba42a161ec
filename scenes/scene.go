package scenes

import (
	"time"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
)

// Mode says what a trigger does while a run of the same scene is active.
// The semantics are Home Assistant's automation modes; this package only
// parses them, the agent enforces them.
type Mode string

// Scene modes.
const (
	// ModeSingle rejects a trigger while a run is active.
	ModeSingle Mode = "single"
	// ModeRestart cancels the active run, then starts a new one.
	ModeRestart Mode = "restart"
	// ModeQueued starts the new run after the active one ends.
	ModeQueued Mode = "queued"
	// ModeParallel runs alongside the active run.
	ModeParallel Mode = "parallel"
)

func (m Mode) valid() bool {
	switch m {
	case ModeSingle, ModeRestart, ModeQueued, ModeParallel:
		return true
	}
	return false
}

// Scene defaults and limits.
const (
	DefaultPriority    = 50
	DefaultDeadline    = 5 * time.Minute
	DefaultMode        = ModeSingle
	DefaultWaitTimeout = 30 * time.Second
	// MaxDuration bounds every duration in a scene file; an edge mission
	// that runs for more than a day is a mistake.
	MaxDuration = 24 * time.Hour
	// MaxSteps bounds a scene's steps, each branch of a parallel group
	// counting as one.
	MaxSteps = 100
	// MaxFileSize bounds a scene file.
	MaxFileSize = 1 << 20
	// MaxDescription bounds a scene's description in bytes.
	MaxDescription = 1024
)

// Step kinds a scene produces. DelayKind is handled by DelayHandler; the
// others are the devices package's, whose handlers they name.
const (
	CommandKind = devices.KindCommand
	RestoreKind = devices.KindRestore
	WaitKind    = devices.KindWaitState
	DelayKind   = "delay"
)

// DelayCode is the code of a delay step's not-ready wait, which is the
// delay itself, not a device that is not ready.
const DelayCode = "delay"

// Info describes a scene for the agent and for people. It is a copy;
// changing it changes nothing.
type Info struct {
	Name        string
	Description string
	File        string
	Mode        Mode
	Priority    int
	Deadline    time.Duration
	// Steps is the number of steps of a mission built from the scene.
	Steps int
	// Params are the trigger parameters the scene reads, sorted by name.
	Params []Param
}

// Param is a trigger parameter a scene reads.
type Param struct {
	Name string
	// Required is true when no step gives the parameter a default.
	Required bool
	// Default is the value used when the trigger leaves it out; when
	// several steps give defaults, the first step's.
	Default any
}

// value is a step parameter: a constant, or a trigger parameter with an
// optional default.
type value struct {
	constant   any
	from       string
	def        any
	hasDefault bool
}

type stepKind int

const (
	kindCommand stepKind = iota
	kindDelay
	kindWait
)

// command is an action on a device with its parameters.
type command struct {
	action string
	params map[string]value
}

// step is a validated scene step.
type step struct {
	id   string
	name string // label for people: the device, "delay", "wait_for ..."
	kind stepKind

	device string
	command
	timeout         time.Duration
	retry           driver.RetryPolicy
	verify          bool
	verifyTimeout   time.Duration
	ackTimeout      time.Duration
	restore         bool     // compensate = "restore"
	compensate      *command // compensate = { action, params }
	continueOnError bool
	onConflict      string // "" takes the scene's

	delay time.Duration

	state          map[string]any // wait_for
	waitTimeout    time.Duration
	waitTimeoutSet bool

	group *driver.Group // set on the branches of a parallel group
}

// scene is a validated scene.
type scene struct {
	name        string
	description string
	file        string
	priority    int
	deadline    time.Duration
	mode        Mode
	policy      driver.Policy // the scene's partial-failure policy
	onConflict  string        // the scene's arbitration policy ("" is preempt)
	// steps are flat: a parallel group is its branches, one step each,
	// consecutive, sharing one group.
	steps     []step
	schedules []Schedule
}
