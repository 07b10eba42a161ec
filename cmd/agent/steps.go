package main

import (
	"encoding/json"

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

func stepTargetRaw(params json.RawMessage) (device, action string) {
	var p struct {
		Device string `json:"device"`
		Action string `json:"action"`
	}
	_ = json.Unmarshal(params, &p)
	return p.Device, p.Action
}
