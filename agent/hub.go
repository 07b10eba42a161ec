package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/sortie-edge/sortie/agent/hubsync"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/scenes"
	"github.com/sortie-edge/sortie/uplink"
)

// Heartbeat implements hubsync.HeartbeatSource: the device inventory with
// availability and last reported state, the number of live missions, and
// the scenes with their parameters (the hub's scene picker).
func (a *Agent) Heartbeat(context.Context) uplink.Heartbeat {
	q := a.drv.Queue()
	active := 0
	for _, n := range q.ByState {
		active += n
	}
	hb := uplink.Heartbeat{Active: active}
	for _, d := range a.dev.Registry().Devices {
		ds := uplink.DeviceState{ID: d.ID, Type: d.Type, Name: d.Name, Room: d.Room, Online: a.dev.Available(d.ID)}
		if st, ok := a.dev.State(d.ID); ok {
			ds.State = st
		}
		hb.Devices = append(hb.Devices, ds)
	}
	cat := a.catalog()
	for _, name := range cat.Names() {
		info, _ := cat.Scene(name)
		si := uplink.SceneInfo{Name: info.Name, Description: info.Description}
		for _, p := range info.Params {
			si.Params = append(si.Params, uplink.SceneParam{Name: p.Name, Required: p.Required, Default: p.Default})
		}
		hb.Scenes = append(hb.Scenes, si)
	}
	if a.cfg != nil {
		hb.Config = a.cfg.heartbeat()
	}
	return hb
}

// Control implements hubsync.ControlHandler: the hub's requests go through
// the same paths as local ones (a trigger through the scene modes and
// request-ID idempotency; the rest to the driver).
func (a *Agent) Control(ctx context.Context, c uplink.Control) uplink.ControlResult {
	res := uplink.ControlResult{ID: c.ID}
	fail := func(code string, err error) uplink.ControlResult {
		res.Error, res.Code = err.Error(), code
		return res
	}
	if c.Action == uplink.ActionBundle {
		return a.offered(ctx, c)
	}
	if c.Action == uplink.ActionTrigger {
		reqID := c.RequestID
		if reqID == "" {
			reqID = "hub-" + c.ID
		}
		// Through the trigger decoder, so a hub request is checked and
		// normalised exactly like one from an app.
		payload, err := json.Marshal(map[string]any{"scene": c.Scene, "request_id": reqID, "source": "hub", "params": c.Params})
		if err != nil {
			return fail("invalid", err)
		}
		tr, err := scenes.DecodeTrigger(payload)
		if err != nil {
			a.trig.declined(viaHub)(scenes.Trigger{RequestID: reqID, Scene: c.Scene, Source: "hub"}, scenes.Rejection(reqID, c.Scene, err, scenes.ReasonBadJSON))
			var te *scenes.TriggerError
			if errors.As(err, &te) {
				return fail(te.Reason, errors.New(te.Msg))
			}
			return fail("invalid", err)
		}
		reply, err := a.trig.call(ctx, tr, viaHub)
		if err != nil {
			return fail("unavailable", err)
		}
		if reply.Status != scenes.StatusAccepted {
			return fail(reply.Reason, errors.New(reply.Message))
		}
		res.OK, res.MissionID, res.State = true, reply.MissionID, reply.State
		return res
	}
	var op func(context.Context, string) (*driver.Mission, error)
	switch c.Action {
	case uplink.ActionPause:
		op = a.drv.Pause
	case uplink.ActionResume:
		op = a.drv.Resume
	case uplink.ActionCancel:
		op = a.drv.Cancel
	case uplink.ActionRetry:
		op = a.drv.Retry
	default:
		return fail("invalid", fmt.Errorf("unknown action %q", c.Action))
	}
	m, err := op(ctx, c.MissionID)
	switch {
	case errors.Is(err, driver.ErrNotFound):
		return fail("not_found", err)
	case errors.Is(err, driver.ErrTerminal), errors.Is(err, driver.ErrIllegalTransition):
		return fail("conflict", err)
	case err != nil:
		return fail("internal", err)
	}
	res.OK, res.MissionID, res.State = true, m.ID, m.State
	a.log.Info("hub control", "action", c.Action, "mission", m.ID, "state", m.State, "control_id", c.ID)
	return res
}

// startUplink connects the store's outbox to the hub.
func (a *Agent) startUplink() error {
	h := a.opts.Hub
	var err error
	a.up, err = hubsync.New(hubsync.Options{
		Broker: h.URL, Brokers: h.URLs, Gateway: a.opts.Gateway, ClientID: h.ClientID, NoRetain: h.NoRetain, Username: h.Username, Password: h.Password, TLS: h.TLS,
		Prefix: h.Prefix, Source: a.db, Traces: a.db, Heartbeat: a, Control: a,
		Logger: a.log, Version: a.opts.Version, HeartbeatInterval: h.Heartbeat,
		OnConnect: a.onHubConnect,
	})
	if err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	a.drv.Observe(a.up)
	a.traces.flushed = a.up.Notify
	a.metrics.watchSync(a.up, a.db)
	return nil
}
