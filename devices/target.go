package devices

import (
	"encoding/json"

	"github.com/sortie-edge/sortie/driver"
)

// StepTarget reads the device and action a step addresses, from the
// params shape of the device step kinds (the kind itself when it names
// no action), for labels and views.
func StepTarget(s driver.Step) (device, action string) {
	device, action = ParamsTarget(s.Params)
	if action == "" {
		action = s.Kind
	}
	return device, action
}

// RanTarget is StepTarget for a step that ran: a command step's outputs
// name its device and action, which spares decoding its params again on
// every step.
func RanTarget(s driver.Step, out map[string]any) (device, action string) {
	if s.Kind == KindCommand {
		d, _ := out["device"].(string)
		a, _ := out["action"].(string)
		if d != "" && a != "" {
			return d, a
		}
	}
	return StepTarget(s)
}

// ParamsTarget reads the device and action from a step's raw params;
// "" for what they do not name.
func ParamsTarget(params json.RawMessage) (device, action string) {
	var p struct {
		Device string `json:"device"`
		Action string `json:"action"`
	}
	_ = json.Unmarshal(params, &p)
	return p.Device, p.Action
}
