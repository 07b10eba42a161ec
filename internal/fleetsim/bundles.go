package fleetsim

import (
	"errors"
	"fmt"
	"time"

	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/uplink"
)

// What follows is the agent's configs.apply, startTrial, decide, keep
// and revert (agent/bundles.go) for a gateway that takes bundles from
// the hub only and keeps its state in memory: the same order of checks,
// statuses, reasons and messages, so that a hub cannot tell the two
// apart (TestLightGatewayAnswersOffersAsTheAgentDoes).

// outcome is a bundle status and where its bundle came from: only
// statuses about a hub's bundles go to the hub.
type outcome struct {
	uplink.BundleStatus
	source string
}

// in is a bundle to apply and where it comes from.
type in struct {
	hash    string
	encoded []byte
	version uint64
	source  string
	rollout string
	soak    time.Duration
}

// errStale says a hub's offer is older than, or the same as, one taken.
var errStale = errors.New("stale bundle offer")

// offeredLocked handles a hub's bundle control: the answer says whether
// the gateway took it; what became of it follows as bundle statuses.
func (g *Gateway) offeredLocked(c uplink.Control) uplink.ControlResult {
	res := uplink.ControlResult{ID: c.ID}
	o := c.Bundle
	out, err := g.applyLocked(in{hash: o.Hash, encoded: o.Bundle, version: o.Version, source: uplink.SourceHub, rollout: o.Rollout, soak: o.Soak()})
	switch {
	case err != nil:
		res.Code, res.Error = codeStale, err.Error()
	case out.Status == uplink.BundleRejected:
		res.Code, res.Error = out.Reason, out.Message
	default:
		res.OK = true
	}
	return res
}

// ApplyLocal applies b as "agent apply DIR" would on the gateway (a
// hand edit that takes effect): validated, on trial for Options.Soak,
// then kept or reverted by itself; its heartbeat then says source
// "local", and the hub hears no status about it.
func (g *Gateway) ApplyLocal(b *bundle.Bundle) (uplink.BundleStatus, error) {
	enc, err := b.Encode()
	if err != nil {
		return uplink.BundleStatus{}, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	out, err := g.applyLocked(in{hash: bundle.HashOf(enc), encoded: enc, source: uplink.SourceLocal})
	return out.BundleStatus, err
}

// applyLocked runs one bundle through: received, validated, swapped
// in and put on trial; or rejected, with nothing changed. A hub's offer
// older than the newest taken is refused with errStale; one of the same
// version is answered with what became of it, not applied again.
func (g *Gateway) applyLocked(b in) (outcome, error) {
	clock := g.f.opts.Clock
	now := clock.Now()
	hub := b.source == uplink.SourceHub
	if hub && b.version <= g.hubVersion {
		if last := g.last; b.version == g.hubVersion && last != nil && last.Version == b.version && last.Hash == b.hash {
			g.sendLocked(*last)
			return *last, nil
		}
		return outcome{}, fmt.Errorf("%w: version %d, this gateway took version %d", errStale, b.version, g.hubVersion)
	}
	out := outcome{uplink.BundleStatus{Hash: b.hash, Version: b.version, Rollout: b.rollout, Status: uplink.BundleReceived, At: now, Current: g.cur.k.hash}, b.source}
	if hub {
		g.hubVersion = b.version
	}
	g.settleLocked(out)

	reject := func(reason, msg string) (outcome, error) {
		out.Status, out.Reason, out.Message, out.At = uplink.BundleRejected, reason, msg, clock.Now()
		g.settleLocked(out)
		return out, nil
	}
	k := g.f.known.judge(b.hash, b.encoded)
	switch {
	case k.decodeErr != nil:
		return reject(uplink.ReasonInvalid, k.decodeErr.Error())
	case !bundle.Compatible(k.b.MinAgent, g.f.opts.Version):
		return reject(uplink.ReasonAgentTooOld, fmt.Sprintf("the bundle needs agent %s or newer; this is %s", k.b.MinAgent, g.f.opts.Version))
	case k.err != nil:
		return reject(uplink.ReasonInvalid, k.err.Error())
	}
	next := ref{k: k, version: b.version, source: b.source, rollout: b.rollout, since: now}
	if k.hash == g.cur.k.hash && g.tr == nil {
		// Already running: only its name changes.
		next.since = g.cur.since
		g.cur = next
		out.Status, out.At = uplink.BundleHealthy, now
		g.settleLocked(out)
		return out, nil
	}
	back := g.cur
	if g.tr != nil {
		back = g.prev
	}
	out.Status, out.At, out.Current = uplink.BundleApplied, clock.Now(), b.hash
	g.last = &out
	if g.tr != nil {
		tried := g.cur
		g.endTrialLocked()
		g.sendLocked(outcome{uplink.BundleStatus{Hash: tried.k.hash, Version: tried.version, Rollout: tried.rollout, Status: uplink.BundleReverted,
			Reason: uplink.ReasonSuperseded, Message: fmt.Sprintf("replaced by bundle %s while on trial", bundle.Short(b.hash)), At: out.At, Current: b.hash}, tried.source})
	}
	g.prev, g.cur = back, next
	g.startTrialLocked(back.k, k, b.soak, hub)
	g.sendLocked(out)
	if hub && g.fault&FaultUplinkCut != 0 {
		g.cutNext = true
	}
	return out, nil
}

// settleLocked makes o the latest outcome and says it.
func (g *Gateway) settleLocked(o outcome) {
	g.last = &o
	g.sendLocked(o)
}

// sendLocked publishes a bundle status about a hub's bundle on the
// connection that is up; the latest is said again on the next
// connection.
func (g *Gateway) sendLocked(o outcome) {
	if o.source != uplink.SourceHub {
		return
	}
	st := o.BundleStatus
	st.Gateway = g.id
	if err := g.publishLocked(g.topics().BundleStatus(g.id), false, st); err != nil {
		g.f.log.Debug("bundle status not sent", "gateway", g.id, "status", st.Status, "err", err)
		return
	}
	g.f.stats.statuses.Add(1)
}

// startTrialLocked begins watching next, applied over old.
func (g *Gateway) startTrialLocked(old, next *known, soak time.Duration, fromHub bool) {
	o := &g.f.opts
	if soak <= 0 {
		soak = o.Soak
	}
	now := o.Clock.Now()
	t := &trial{soakEnd: now.Add(soak), confirmBy: now.Add(soak + o.Confirm), fromHub: fromHub, devices: g.f.known.trialDevices(old, next)}
	wake := func() {
		if g.f.ctx.Err() == nil {
			g.decide()
		}
	}
	t.stops = append(t.stops, o.Clock.AfterFunc(soak, wake))
	if fromHub {
		t.stops = append(t.stops, o.Clock.AfterFunc(soak+o.Confirm, wake))
	}
	g.tr = t
}

func (g *Gateway) endTrialLocked() {
	if g.tr == nil {
		return
	}
	for _, stop := range g.tr.stops {
		stop()
	}
	g.tr = nil
}

func (g *Gateway) decide() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.decideLocked()
}

// decideLocked keeps or reverts the bundle on trial once its soak is
// over: its devices must answer, and the hub connection be up by the
// end of the confirm window.
func (g *Gateway) decideLocked() {
	t := g.tr
	if t == nil || g.closed {
		return
	}
	now := g.f.opts.Clock.Now()
	if now.Before(t.soakEnd) {
		return
	}
	var silent []string
	for _, d := range t.devices {
		if g.silentLocked(d) {
			silent = append(silent, d)
		}
	}
	if len(silent) > 0 {
		g.revertLocked(uplink.ReasonDevicesSilent, fmt.Sprintf("devices of the changed scenes did not answer by the end of the soak: %v", silent))
		return
	}
	if t.fromHub && !g.up {
		if now.Before(t.confirmBy) {
			return
		}
		g.revertLocked(uplink.ReasonUplinkDown, fmt.Sprintf("no hub connection by %s, so the hub could not confirm the bundle", t.confirmBy.Format(time.RFC3339)))
		return
	}
	g.endTrialLocked()
	g.prev = ref{}
	g.settleLocked(outcome{uplink.BundleStatus{Hash: g.cur.k.hash, Version: g.cur.version, Rollout: g.cur.rollout, Status: uplink.BundleHealthy,
		At: now, Current: g.cur.k.hash}, g.cur.source})
}

// revertLocked goes back to what ran before the bundle on trial.
func (g *Gateway) revertLocked(reason, msg string) {
	tried := g.cur
	g.endTrialLocked()
	back := g.prev
	if back.k == nil {
		back = ref{k: g.boot, source: uplink.SourceFiles, since: g.started}
	}
	out := outcome{uplink.BundleStatus{Hash: tried.k.hash, Version: tried.version, Rollout: tried.rollout, Status: uplink.BundleReverted,
		Reason: reason, Message: msg, At: g.f.opts.Clock.Now(), Current: back.k.hash}, tried.source}
	g.cur, g.prev = back, ref{}
	g.settleLocked(out)
	g.reconnectLocked()
}

// Restart restarts the gateway as a killed agent comes back (the
// agent's openConfigs): its connection drops without a goodbye (the
// broker publishes its will), a bundle on trial is reverted
// ("restarted": a bundle is kept only once this process saw it
// healthy), the config files are read again (a hand edit takes effect
// when no bundle was kept), and it connects again and says its latest
// status. What it took from the hub and answered is kept, as the
// agent's store keeps it.
func (g *Gateway) Restart() {
	g.mu.Lock()
	c := g.client
	g.client, g.down, g.cutNext = nil, false, false
	if g.up {
		g.up = false
		g.f.connected.Add(-1)
	}
	now := g.f.opts.Clock.Now()
	g.started, g.boot = now, g.files
	files := ref{k: g.boot, source: uplink.SourceFiles, since: now}
	if g.tr != nil {
		tried := g.cur
		g.endTrialLocked()
		back := g.prev
		if back.k == nil || back.source == uplink.SourceFiles {
			back = files
		}
		g.last = &outcome{uplink.BundleStatus{Hash: tried.k.hash, Version: tried.version, Rollout: tried.rollout, Status: uplink.BundleReverted,
			Reason: uplink.ReasonRestarted, Message: "the agent restarted before the bundle was confirmed healthy", At: now, Current: back.k.hash}, tried.source}
		g.cur, g.prev = back, ref{}
	} else if g.cur.source == uplink.SourceFiles {
		g.cur = files
	}
	g.mu.Unlock()
	if c != nil {
		c.Abort()
		c.Close()
	}
	g.connect()
}
