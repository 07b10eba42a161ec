package main

import (
	"encoding/json"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
)

// stepTarget reads the device and action a step addresses, from the
// params shape of the device step kinds.
func stepTarget(s driver.Step) (device, action string) {
	device, action = stepTargetRaw(s.Params)
	if action == "" {
		action = s.Kind
	}
	return device, action
}

// ranTarget is stepTarget for a step that ran: a command step's outputs
// name its device and action, which spares decoding its params again on
// every step.
func ranTarget(s driver.Step, out map[string]any) (device, action string) {
	if s.Kind == devices.KindCommand {
		d, _ := out["device"].(string)
		a, _ := out["action"].(string)
		if d != "" && a != "" {
			return d, a
		}
	}
	return stepTarget(s)
}

func stepTargetRaw(params json.RawMessage) (device, action string) {
	var p struct {
		Device string `json:"device"`
		Action string `json:"action"`
	}
	_ = json.Unmarshal(params, &p)
	return p.Device, p.Action
}
