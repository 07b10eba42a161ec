package devices

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sortie-edge/sortie/devices/wire"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/fifo"
	"github.com/sortie-edge/sortie/internal/jsonenc"
)

// Step kinds served by Handlers.
const (
	// KindCommand sends one command to a device (params: CommandParams).
	KindCommand = "device.command"
	// KindRestore undoes a KindCommand step by setting the device back to
	// the state it reported before (params: RestoreParams). It is meant as
	// that step's compensation.
	KindRestore = "device.restore"
	// KindWaitState waits until a device reports a state (params:
	// WaitParams).
	KindWaitState = "device.wait_state"
)

// Step error codes produced by the handlers, besides the device codes
// (CodeBusy, ...), which pass through.
const (
	CodeDeviceOffline = "device_offline" // not ready: the device's availability is "offline"
	CodeUnknownDevice = "unknown_device" // permanent: not in the registry
	CodeBadStep       = "invalid_step"   // permanent: the step's params do not decode
	CodeAckTimeout    = "ack_timeout"    // retryable: no ack in time
	CodeNotConnected  = "not_connected"  // retryable: the broker connection is down
	CodeInFlight      = "in_flight"      // retryable: the same command is already waiting for its ack
	CodeVerifyFailed  = "verify_failed"  // permanent: acked, but the state never matched
	CodeWaitingState  = "waiting_state"  // not ready: wait_state is still waiting
	CodeWaitTimeout   = "wait_timeout"   // permanent: wait_state's timeout passed
	CodeNoTurn        = "no_turn"        // retryable: the device or its link gave the command no turn in the step's time
)

// CommandParams are the params of a KindCommand step.
type CommandParams struct {
	Device string         `json:"device"`
	Action string         `json:"action"`
	Params map[string]any `json:"params,omitempty"`
	// Verify waits, after a positive ack, until the device reports the
	// state the command leads to (Registry.Expected).
	Verify        bool            `json:"verify,omitempty"`
	VerifyTimeout driver.Duration `json:"verify_timeout,omitempty"`
	// AckTimeout overrides the client's ack timeout for this step.
	AckTimeout driver.Duration `json:"ack_timeout,omitempty"`
	// OnConflict says what the step does when another live mission owns
	// the device: ConflictPreempt (default), ConflictQueue or
	// ConflictSkip. A device commanded by a newer mission supersedes the
	// step whatever it says.
	OnConflict string `json:"on_conflict,omitempty"`
}

// RestoreParams are the params of a KindRestore step; all are optional.
type RestoreParams struct {
	// Device defaults to the "device" output of the step being undone.
	Device        string          `json:"device,omitempty"`
	Verify        bool            `json:"verify,omitempty"`
	VerifyTimeout driver.Duration `json:"verify_timeout,omitempty"`
	AckTimeout    driver.Duration `json:"ack_timeout,omitempty"`
}

// WaitParams are the params of a KindWaitState step.
type WaitParams struct {
	Device string         `json:"device"`
	State  map[string]any `json:"state"`
	// Timeout is measured from the step's first attempt; zero means
	// HandlerOptions.WaitTimeout.
	Timeout driver.Duration `json:"timeout,omitempty"`
}

// HandlerOptions tunes Handlers. Zero fields take the defaults shown.
type HandlerOptions struct {
	// OfflineRetry is how soon a step for an offline device is tried
	// again if no availability change wakes the driver first (5s).
	OfflineRetry time.Duration
	// VerifyTimeout is the default verify_timeout (5s).
	VerifyTimeout time.Duration
	// WaitTimeout is the default timeout of wait_state (30s).
	WaitTimeout time.Duration
	// MaxRetryAfter caps how long a waiting wait_state step sleeps between
	// looks when no state change wakes the driver (5s).
	MaxRetryAfter time.Duration
	// PriorCache is how many steps' prior states are remembered across
	// attempts (1024).
	PriorCache int
	// Now tells time; nil means time.Now.
	Now func() time.Time
	// OnTurn, when set, is told how long each command waited for its
	// turn on its device and link ("" for none), for a metric. It runs
	// under the admission's lock and must not block.
	OnTurn func(link string, waited time.Duration)
	// OnConflict, when set, is told of each arbitration between two
	// missions over a device, so that both timelines can show it. It
	// must not block.
	OnConflict func(Conflict)
}

// Handlers are the driver step handlers for devices. They keep no
// mission state: everything comes from the StepRequest, the registry and
// the client's view of the devices, apart from a bounded cache of prior
// states (see Command). Safe for concurrent use.
type Handlers struct {
	client *Client
	// reg is the registry the checks and expectations of commands sent
	// from now on read (SetRegistry swaps it); prev the one before it,
	// for the verification of a command sent under it.
	reg  atomic.Pointer[Registry]
	prev atomic.Pointer[Registry]
	opts HandlerOptions
	// admit gives commands their turn on busy devices and links.
	admit *admission
	// owners knows, for each device, the newest mission that commanded
	// it (see arbitrate).
	owners *owners

	mu     sync.Mutex
	priors *fifo.Map[string, map[string]any]

	// decoded holds command params decoded and checked against the
	// registry, by their JSON: a home runs the same few steps over and
	// over, and decoding them strictly cost more than the rest of a
	// command's preparation. The values are shared, so nothing may change
	// them.
	decMu   sync.Mutex
	decoded map[string]checkedParams
}

// checkedParams are decoded command params and the outcome of checking
// them against reg.
type checkedParams struct {
	p     CommandParams
	check error
	reg   *Registry
}

// Bounds of Handlers.decoded: params longer than paramsCacheLen are not
// kept, and the cache is emptied when it holds paramsCacheMax.
const (
	paramsCacheLen = 1024
	paramsCacheMax = 512
)

// NewHandlers returns the device step handlers using c to talk to
// devices and r to validate commands.
func NewHandlers(c *Client, r *Registry, opts HandlerOptions) *Handlers {
	if opts.OfflineRetry <= 0 {
		opts.OfflineRetry = 5 * time.Second
	}
	if opts.VerifyTimeout <= 0 {
		opts.VerifyTimeout = 5 * time.Second
	}
	if opts.WaitTimeout <= 0 {
		opts.WaitTimeout = 30 * time.Second
	}
	if opts.MaxRetryAfter <= 0 {
		opts.MaxRetryAfter = 5 * time.Second
	}
	if opts.PriorCache <= 0 {
		opts.PriorCache = 1024
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	h := &Handlers{
		client: c, opts: opts,
		admit:   newAdmission(r, opts.Now, c.opts.OnChange, opts.OnTurn),
		owners:  newOwners(),
		priors:  fifo.New[string, map[string]any](opts.PriorCache),
		decoded: make(map[string]checkedParams),
	}
	h.reg.Store(r)
	return h
}

// SetRegistry swaps r in: the client's first (Client.SetRegistry, whose
// error it returns with nothing changed), then the checks, expectations
// and limits of the commands the steps send from now on. A command in
// flight finishes as it was sent: its ack, its turn on its device and
// link, its verification. Who owns each device (the arbitration between
// missions) is kept: it is by device ID. A device r no longer names
// fails the next step that commands it, permanently, as any unknown
// device does (docs/fleet.md says why).
func (h *Handlers) SetRegistry(r *Registry) error {
	if err := h.client.SetRegistry(r); err != nil {
		return err
	}
	h.prev.Store(h.reg.Load())
	h.reg.Store(r)
	h.admit.setRegistry(r)
	return nil
}

// Links reports the admission state of each link's devices, and under ""
// that of the devices on no link: commands in flight and waiting.
func (h *Handlers) Links() map[string]LinkStats { return h.admit.stats() }

// Register hands each handler to add under its kind, e.g.
// h.Register(func(k string, x driver.Handler) { opts.Handlers[k] = x }).
func (h *Handlers) Register(add func(kind string, h driver.Handler)) {
	add(KindCommand, driver.HandlerFunc(h.Command))
	add(KindRestore, driver.HandlerFunc(h.Restore))
	add(KindWaitState, driver.HandlerFunc(h.WaitState))
}

// decodeParams decodes step params strictly: a misspelt key is an error,
// not a silently ignored option. Numbers stay json.Number.
func decodeParams(raw json.RawMessage, v any) error {
	if len(bytes.TrimSpace(raw)) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return driver.PermanentError(CodeBadStep, fmt.Errorf("step params: %w", err))
	}
	return nil
}

// Command executes a KindCommand step.
//
// The command's ID is req.IdempotencyKey, the same for every attempt, so
// a device applies it once however often it is retried. Outputs:
// "device", "action", "command_id", "prior_state" (the device's state
// before the command, when known) and "state" (after it, when known).
//
// prior_state is the ack's "prior" when the device sends one; otherwise
// the cached state when this step was first attempted in this process
// (later attempts may run after the device already applied the command,
// so their cached state would be the new one).
func (h *Handlers) Command(ctx context.Context, req driver.StepRequest) (map[string]any, error) {
	c, err := h.commandParams(req.Params)
	if err != nil {
		return nil, err
	}
	if c.check != nil {
		// Checked anew after a registry swap: a turn the step was queued
		// for goes to the next command.
		h.admit.withdraw(req.IdempotencyKey)
		return nil, c.check
	}
	return h.send(ctx, req, c.p)
}

// commandParams decodes a command step's params and checks them, or finds
// them done. Params that fail to decode are not kept: each attempt
// reports them.
func (h *Handlers) commandParams(raw json.RawMessage) (checkedParams, error) {
	reg := h.reg.Load()
	h.decMu.Lock()
	c, ok := h.decoded[string(raw)]
	h.decMu.Unlock()
	if ok && c.reg == reg {
		return c, nil
	}
	c = checkedParams{reg: reg}
	if err := decodeParams(raw, &c.p); err != nil {
		return checkedParams{}, err
	}
	c.check = h.checkWith(reg, c.p)
	if len(raw) <= paramsCacheLen {
		h.decMu.Lock()
		if len(h.decoded) >= paramsCacheMax {
			clear(h.decoded)
		}
		h.decoded[string(raw)] = c
		h.decMu.Unlock()
	}
	return c, nil
}

// check checks a command against the registry, as a step error.
func (h *Handlers) check(p CommandParams) error { return h.checkWith(h.reg.Load(), p) }

func (h *Handlers) checkWith(reg *Registry, p CommandParams) error {
	switch p.OnConflict {
	case "", ConflictPreempt, ConflictQueue, ConflictSkip:
	default:
		return driver.PermanentError(CodeBadStep, fmt.Errorf("on_conflict %q is not preempt, queue or skip", p.OnConflict))
	}
	err := reg.Check(p.Device, p.Action, p.Params)
	if err == nil {
		return nil
	}
	var ce *CheckError
	if errors.As(err, &ce) {
		return driver.PermanentError(ce.Code(), err)
	}
	return driver.PermanentError(wire.CodeInvalidParam, err)
}

// Where a parked command step left off (driver.Parked.Note): waiting
// for the connection, for the ack, or for the state it verifies (the
// note then carries the verification's deadline).
const (
	noteAdmit   = "admit"
	noteConnect = "connect"
	noteAck     = "ack"
	noteVerify  = "verify:"
	noteOwner   = "owner" // queued behind another mission's ownership
)

// send sends a checked command and parks until its ack (driver.Pending):
// the step holds no worker while the device takes its time. Resumed, it
// collects the ack from the client, which keeps it by command ID, and
// verifies the state the same way, woken by the device's reports.
func (h *Handlers) send(_ context.Context, req driver.StepRequest, p CommandParams) (map[string]any, error) {
	now := h.opts.Now()
	if r := req.Resume; r != nil && r.Abandon {
		h.admit.withdraw(req.IdempotencyKey) // a turn queued or granted goes to the next command
		return nil, nil
	}
	if r := req.Resume; r != nil {
		switch {
		case r.Note == noteAck:
			ack, ok, err := h.client.Collect(p.Device, req.IdempotencyKey, !now.Before(r.Until))
			if !ok {
				return nil, driver.InFlight(AckKey(p.Device, req.IdempotencyKey), r.Until, noteAck, nil)
			}
			return h.acked(req, p, ack, err, now)
		case strings.HasPrefix(r.Note, noteVerify):
			return h.verified(req, p, r, now)
		}
		// noteAdmit, noteConnect: the turn or the connection has come (or
		// the wait is over): send.
	}
	if req.Compensating {
		if err := h.undoAllowed(req, p.Device); err != nil {
			return nil, err
		}
	} else if err := h.arbitrate(req, p.Device, p.OnConflict); err != nil {
		return nil, err
	}
	// A command sent now could not be waited for: nothing is sent, and
	// a turn held or granted meanwhile goes to the next command. (A
	// command sent at its deadline would hold its device's turn until
	// an ack that may never come.)
	if !req.Deadline.IsZero() && !now.Before(req.Deadline) {
		h.admit.withdraw(req.IdempotencyKey)
		return nil, driver.RetryableError(CodeNoTurn, fmt.Errorf("device %s: no turn to send within the step's time", p.Device))
	}
	if !h.client.Available(p.Device) {
		h.admit.withdraw(req.IdempotencyKey) // an offline device's turn is no use
		return nil, driver.WaitError(p.Device, CodeDeviceOffline, h.opts.OfflineRetry,
			fmt.Errorf("device %s is offline", p.Device))
	}
	h.prior(req.IdempotencyKey, p.Device) // remembered at the first attempt, before the command changes it
	if !h.admit.acquire(req.IdempotencyKey, p.Device, req.Priority, req.Created) {
		return nil, driver.Pending(AdmitKey(req.IdempotencyKey), req.Deadline, noteAdmit, nil)
	}
	ackTimeout := p.AckTimeout.D()
	if ackTimeout <= 0 {
		ackTimeout = h.client.opts.AckTimeout
	}
	giveUp := now.Add(ackTimeout)
	if !req.Deadline.IsZero() && req.Deadline.Before(giveUp) {
		giveUp = req.Deadline
	}
	cmd := wire.Command{
		ID:      req.IdempotencyKey,
		Action:  p.Action,
		Params:  p.Params,
		Attempt: req.Attempt,
		TraceID: req.TraceID,
	}
	release := func() { h.admit.release(p.Device) }
	// Claimed with the device's turn held, so that commands go out in
	// the order their missions' claims were taken: an older mission
	// never sends after a newer one has.
	yield := !req.Compensating && (p.OnConflict == ConflictQueue || p.OnConflict == ConflictSkip)
	switch verdict, by := h.owners.claim(p.Device, req.MissionID, req.MissionType, req.Created, cmd.ID, yield); verdict {
	case tookOver:
		if !req.Compensating {
			h.tookOver(req, p.Device, by)
		}
	case newerHas, heldBy:
		// Taken since arbitrate looked (another step's claim came first).
		release()
		var err error
		if req.Compensating {
			err = h.undoAllowed(req, p.Device)
		} else {
			err = h.arbitrate(req, p.Device, p.OnConflict) // gives way, or waits for the newer command's outcome
		}
		if err == nil {
			err = driver.RetryableError(CodeInFlight, fmt.Errorf("%s changed hands as the command was sent", p.Device))
		}
		return nil, err
	}
	var ack wire.Ack
	var done bool
	var err error
	if h.client.Speaks(p.Device) {
		// No command ID reaches these devices: the command is the state
		// it leads to, which is also what confirms it.
		ack, done, err = h.client.PostState(p.Device, cmd.ID, h.reg.Load().Expected(p.Device, p.Action, p.Params), req.Attempt, giveUp, release)
	} else {
		ack, done, err = h.client.Post(p.Device, cmd, giveUp, release)
	}
	if done || err != nil {
		release() // nothing went out: the turn goes to the next
	}
	if !done && err != nil {
		h.settle(p.Device, req.MissionID, outRefused) // not sent: nothing changed
	}
	switch {
	case errors.Is(err, ErrNotConnected):
		return nil, driver.Pending(ConnectedKey, giveUp, noteConnect, nil)
	case !done && err != nil:
		return nil, h.classifySend(err)
	case !done:
		return nil, driver.InFlight(AckKey(p.Device, cmd.ID), giveUp, noteAck, nil)
	}
	return h.acked(req, p, ack, err, now)
}

// acked turns a command's ack into the step's outputs, or parks to
// verify the state it should have led to.
func (h *Handlers) acked(req driver.StepRequest, p CommandParams, ack wire.Ack, err error, now time.Time) (map[string]any, error) {
	var rej *RejectedError
	switch {
	case errors.As(err, &rej):
		h.settle(p.Device, req.MissionID, outRefused) // the device was not changed
	case err != nil:
		h.settle(p.Device, req.MissionID, outUnknown)
	case req.Compensating:
		h.settle(p.Device, req.MissionID, outUndone) // as before this step
	default:
		h.settle(p.Device, req.MissionID, outApplied)
	}
	if errors.Is(err, driver.ErrAckTimeout) {
		// The same command ID goes out again at the retry; its ack may
		// still come meanwhile, and then the retry ends at once (the
		// client remembers the ack and wakes AckKey).
		return nil, &driver.StepError{Class: driver.Retryable, Code: CodeAckTimeout, WaitFor: AckKey(p.Device, req.IdempotencyKey), Err: err}
	}
	if err != nil {
		return nil, h.classifySend(err)
	}
	prior := ack.Prior
	if prior == nil {
		if pr := h.prior(req.IdempotencyKey, p.Device); pr != nil {
			prior = cloneMap(pr)
		}
	}
	out := map[string]any{"device": p.Device, "action": p.Action, "command_id": req.IdempotencyKey}
	if prior != nil {
		out["prior_state"] = prior
	}
	state := ack.State
	if state == nil {
		state, _ = h.client.State(p.Device)
	}
	if state != nil {
		out["state"] = state
	}
	if !p.Verify {
		return out, nil
	}
	timeout := p.VerifyTimeout.D()
	if timeout <= 0 {
		timeout = h.opts.VerifyTimeout
	}
	until := now.Add(timeout)
	return h.verified(req, p, &driver.Parked{Until: until, Note: noteVerify + until.UTC().Format(time.RFC3339Nano), Out: out}, now)
}

// verified finishes a step once the device reports the state the command
// should have led to, woken by its reports (the key is the device ID).
// Failing is permanent: re-sending the same command ID would be
// deduplicated by the device, which re-acks without acting again, so a
// retry cannot make a device reach a state it did not reach.
func (h *Handlers) verified(req driver.StepRequest, p CommandParams, r *driver.Parked, now time.Time) (map[string]any, error) {
	reg := h.reg.Load()
	want := reg.Expected(p.Device, p.Action, p.Params)
	if want == nil {
		if prev := h.prev.Load(); prev != nil {
			// Sent under the registry swapped out since: verified (and
			// its values hidden) as sent.
			reg, want = prev, prev.Expected(p.Device, p.Action, p.Params)
		}
	}
	got, _ := h.client.State(p.Device)
	out := r.Out
	if matches(got, want) || h.client.Speaks(p.Device) && matchesWithin(got, want) {
		out["state"] = got
		out["verified"] = true
		return out, nil
	}
	// The state a newer mission's command set is not this step's failure.
	if by, newer := h.supersededBy(req, p.Device); newer && !req.Compensating {
		return nil, h.gaveWay(req, p.Device, by)
	}
	until, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(r.Note, noteVerify))
	if err != nil {
		until = r.Until
	}
	if !now.Before(until) {
		return nil, driver.PermanentError(CodeVerifyFailed,
			fmt.Errorf("device %s acked but reported %s, not %s, by %s (another command, from another mission or an app, may have changed it since)",
				p.Device, jsonText(reg.Masked(p.Device, p.Action, got)), jsonText(reg.Masked(p.Device, p.Action, want)), until.Format(time.RFC3339)))
	}
	return nil, driver.InFlight(p.Device, until, r.Note, out)
}

// classifySend maps a Post or Collect error to the driver's classes; a
// device's refusal names the device as people know it.
func (h *Handlers) classifySend(err error) error {
	var rej *RejectedError
	switch {
	case errors.As(err, &rej):
		if rej.Label == "" {
			rej.Label = h.reg.Load().Label(rej.Device)
		}
		if rej.Retryable() {
			return driver.RetryableError(rej.Code, err)
		}
		return driver.PermanentError(rej.Code, err)
	case errors.Is(err, driver.ErrAckTimeout):
		return driver.RetryableError(CodeAckTimeout, err)
	case errors.Is(err, ErrInvalidCommand), errors.Is(err, wire.ErrInvalidID):
		return driver.PermanentError(wire.CodeInvalidParam, err)
	case errors.Is(err, ErrInFlight):
		return driver.RetryableError(CodeInFlight, err)
	case errors.Is(err, ErrNotConnected), errors.Is(err, ErrClosed):
		return driver.RetryableError(CodeNotConnected, err)
	}
	return err
}

// prior returns the device state to record as a step's prior state: the
// state remembered at the step's first attempt, or else the current one,
// which is then remembered.
//
// The map returned is shared and must not be changed: most acks carry
// their own prior state, so it is copied only when used (see send).
func (h *Handlers) prior(key, device string) map[string]any {
	h.mu.Lock()
	defer h.mu.Unlock()
	if st, ok := h.priors.Get(key); ok {
		return st
	}
	st := h.client.sharedState(device)
	if st == nil {
		return nil
	}
	h.priors.Put(key, st)
	return st
}

// jsonText writes a state as JSON, as devices report it, for messages.
func jsonText(v map[string]any) string {
	b, err := jsonenc.AppendValue(nil, v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// Restore executes a KindRestore step: it sends a "set" command with the
// settable keys of the forward step's "prior_state". Its command ID is
// this request's IdempotencyKey, which differs from the forward step's,
// so the device does not mistake it for a repeat. With no prior state
// known it succeeds with "restored": false.
func (h *Handlers) Restore(ctx context.Context, req driver.StepRequest) (map[string]any, error) {
	var p RestoreParams
	if err := decodeParams(req.Params, &p); err != nil {
		return nil, err
	}
	if p.Device == "" {
		p.Device, _ = req.Forward["device"].(string)
	}
	if p.Device == "" {
		return nil, driver.PermanentError(CodeBadStep, errors.New("restore: no device in params or forward outputs"))
	}
	reg := h.reg.Load()
	if _, ok := reg.Device(p.Device); !ok {
		// Removed by a registry swapped in since the forward step: its
		// undo cannot go, and says so rather than "nothing to restore".
		return nil, h.checkWith(reg, CommandParams{Device: p.Device, Action: SetAction})
	}
	prior, _ := req.Forward["prior_state"].(map[string]any)
	set := make(map[string]any, len(prior))
	for _, k := range reg.Settable(p.Device) {
		if v, ok := prior[k]; ok {
			set[k] = v
		}
	}
	if len(set) == 0 {
		return map[string]any{"device": p.Device, "restored": false, "reason": "no prior state known"}, nil
	}
	cmd := CommandParams{
		Device: p.Device, Action: SetAction, Params: set,
		Verify: p.Verify, VerifyTimeout: p.VerifyTimeout, AckTimeout: p.AckTimeout,
	}
	if err := h.check(cmd); err != nil {
		return nil, err
	}
	out, err := h.send(ctx, req, cmd)
	if err != nil {
		return nil, err // a Pending among them: restored is added when it resumes
	}
	out["restored"] = true
	return out, nil
}

// WaitState executes a KindWaitState step. It never blocks: if the state
// does not match yet it returns a not-ready error, and the driver runs it
// again when the device changes (OnChange → Wake) or after the
// retry-after. It measures its timeout from req.Started, so it keeps no
// state between runs.
func (h *Handlers) WaitState(_ context.Context, req driver.StepRequest) (map[string]any, error) {
	var p WaitParams
	if err := decodeParams(req.Params, &p); err != nil {
		return nil, err
	}
	if _, ok := h.reg.Load().Device(p.Device); !ok {
		return nil, driver.PermanentError(CodeUnknownDevice, fmt.Errorf("wait_state: unknown device %q", p.Device))
	}
	if len(p.State) == 0 {
		return nil, driver.PermanentError(CodeBadStep, errors.New("wait_state: no state to wait for"))
	}
	timeout := p.Timeout.D()
	if timeout <= 0 {
		timeout = h.opts.WaitTimeout
	}
	now := h.opts.Now()
	started := req.Started
	if started.IsZero() {
		started = now // an unknown start cannot be timed out; wait a full timeout
	}
	got, _ := h.client.State(p.Device)
	if matches(got, p.State) {
		return map[string]any{"device": p.Device, "state": got}, nil
	}
	remaining := started.Add(timeout).Sub(now)
	if remaining <= 0 {
		return nil, driver.PermanentError(CodeWaitTimeout,
			fmt.Errorf("device %s reported %s, not %s, within %v", p.Device, jsonText(got), jsonText(p.State), timeout))
	}
	return nil, driver.WaitError(p.Device, CodeWaitingState, min(remaining, h.opts.MaxRetryAfter),
		fmt.Errorf("device %s has not reported %s yet", p.Device, jsonText(p.State)))
}
