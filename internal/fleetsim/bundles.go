package fleetsim

import (
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

// registryChanged is the agent's message for ReasonRegistryChanged.
const registryChanged = "the bundle's devices.toml differs from the running registry; this agent cannot swap its device registry while it runs, so a bundle must carry the devices.toml that runs (agent config shows its hash)"

// offeredLocked handles a hub's bundle control: the answer says whether
// the gateway took it; what became of it follows as bundle statuses.
func (g *Gateway) offeredLocked(c uplink.Control) uplink.ControlResult {
	res := uplink.ControlResult{ID: c.ID}
	o := c.Bundle
	clock := g.f.opts.Clock
	now := clock.Now()
	if o.Version <= g.hubVersion {
		if last := g.last; o.Version == g.hubVersion && last != nil && last.Version == o.Version && last.Hash == o.Hash {
			g.sendLocked(*last)
			if last.Status == uplink.BundleRejected {
				res.Code, res.Error = last.Reason, last.Message
			} else {
				res.OK = true
			}
			return res
		}
		res.Code, res.Error = codeStale, fmt.Sprintf("stale bundle offer: version %d, this gateway took version %d", o.Version, g.hubVersion)
		return res
	}
	out := uplink.BundleStatus{Hash: o.Hash, Version: o.Version, Rollout: o.Rollout, Status: uplink.BundleReceived, At: now, Current: g.cur.k.hash}
	g.hubVersion = o.Version
	g.setLast(out)
	g.sendLocked(out)

	reject := func(reason, msg string) uplink.ControlResult {
		out.Status, out.Reason, out.Message, out.At = uplink.BundleRejected, reason, msg, clock.Now()
		g.setLast(out)
		g.sendLocked(out)
		res.Code, res.Error = reason, msg
		return res
	}
	k := g.f.known.judge(o.Hash, o.Bundle)
	switch {
	case k.decodeErr != nil:
		return reject(uplink.ReasonInvalid, k.decodeErr.Error())
	case !bundle.Compatible(k.b.MinAgent, g.f.opts.Version):
		return reject(uplink.ReasonAgentTooOld, fmt.Sprintf("the bundle needs agent %s or newer; this is %s", k.b.MinAgent, g.f.opts.Version))
	case k.err != nil:
		return reject(uplink.ReasonInvalid, k.err.Error())
	case k.registry != g.cur.k.registry:
		return reject(uplink.ReasonRegistryChanged, registryChanged)
	}
	next := ref{k: k, version: o.Version, source: uplink.SourceHub, rollout: o.Rollout, since: now}
	if k.hash == g.cur.k.hash && g.tr == nil {
		// Already running: only its name changes.
		next.since = g.cur.since
		g.cur = next
		out.Status, out.At = uplink.BundleHealthy, now
		g.setLast(out)
		g.sendLocked(out)
		res.OK = true
		return res
	}
	back := g.cur
	if g.tr != nil {
		back = g.prev
	}
	out.Status, out.At, out.Current = uplink.BundleApplied, clock.Now(), o.Hash
	g.setLast(out)
	if g.tr != nil {
		tried := g.cur
		g.endTrialLocked()
		g.sendLocked(uplink.BundleStatus{Hash: tried.k.hash, Version: tried.version, Rollout: tried.rollout, Status: uplink.BundleReverted,
			Reason: uplink.ReasonSuperseded, Message: fmt.Sprintf("replaced by bundle %s while on trial", bundle.Short(o.Hash)), At: out.At, Current: o.Hash})
	}
	g.prev, g.cur = back, next
	g.startTrialLocked(back.k, k, o.Soak())
	g.sendLocked(out)
	if g.fault&FaultUplinkCut != 0 {
		g.cutNext = true
	}
	res.OK = true
	return res
}

func (g *Gateway) setLast(st uplink.BundleStatus) { g.last = &st }

// sendLocked publishes a bundle status on the connection that is up;
// the latest is said again on the next connection.
func (g *Gateway) sendLocked(st uplink.BundleStatus) {
	st.Gateway = g.id
	if err := g.publishLocked(g.topics().BundleStatus(g.id), false, st); err != nil {
		g.f.log.Debug("bundle status not sent", "gateway", g.id, "status", st.Status, "err", err)
		return
	}
	g.f.stats.statuses.Add(1)
}

// startTrialLocked begins watching next, applied over old.
func (g *Gateway) startTrialLocked(old, next *known, soak time.Duration) {
	o := &g.f.opts
	if soak <= 0 {
		soak = o.Soak
	}
	now := o.Clock.Now()
	t := &trial{soakEnd: now.Add(soak), confirmBy: now.Add(soak + o.Confirm), devices: g.f.known.trialDevices(old, next)}
	wake := func() {
		if g.f.ctx.Err() == nil {
			g.decide()
		}
	}
	t.stops = append(t.stops, o.Clock.AfterFunc(soak, wake), o.Clock.AfterFunc(soak+o.Confirm, wake))
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
	if !g.up {
		if now.Before(t.confirmBy) {
			return
		}
		g.revertLocked(uplink.ReasonUplinkDown, fmt.Sprintf("no hub connection by %s, so the hub could not confirm the bundle", t.confirmBy.Format(time.RFC3339)))
		return
	}
	g.endTrialLocked()
	g.prev = ref{}
	out := uplink.BundleStatus{Hash: g.cur.k.hash, Version: g.cur.version, Rollout: g.cur.rollout, Status: uplink.BundleHealthy,
		At: now, Current: g.cur.k.hash}
	g.setLast(out)
	g.sendLocked(out)
}

// revertLocked goes back to what ran before the bundle on trial.
func (g *Gateway) revertLocked(reason, msg string) {
	tried := g.cur
	g.endTrialLocked()
	back := g.prev
	if back.k == nil {
		back = ref{k: g.boot, source: uplink.SourceFiles, since: g.started}
	}
	out := uplink.BundleStatus{Hash: tried.k.hash, Version: tried.version, Rollout: tried.rollout, Status: uplink.BundleReverted,
		Reason: reason, Message: msg, At: g.f.opts.Clock.Now(), Current: back.k.hash}
	g.cur, g.prev = back, ref{}
	g.setLast(out)
	g.sendLocked(out)
	g.reconnectLocked()
}
