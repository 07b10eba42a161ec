// Package waterfall turns a mission's timeline into the bars of a
// waterfall chart: each step, and each branch of a parallel group, is a
// bar on a time axis from its first begin to its last outcome, made of
// segments (an attempt running, a not-ready wait, a retry's backoff),
// and each compensation is a bar of its own after the failure, in the
// order the undos ran.
//
// The agent (GET /api/missions/{id}, `agent missions show`) and the hub
// (GET /api/gateways/{gw}/missions/{id}, the dashboard) both derive their
// charts here, from what both of them have: the steps' IDs and the
// mission's events. The agent adds each step's command and device, the
// hub each step's name and target from the mission's step table (which
// gateways before it do not send). Build is a pure function; it imports only
// driver, so the hub links it without the agent's store or devices.
//
// What the timeline does not record is not drawn: the waits inside one
// attempt (the device's or link's turn, the ack, a verify of the
// device's state) are parks in the driver's memory, not events, so they
// are part of the attempt's run segment. A wait that ends an attempt
// (an offline device, a delay, wait_for, a device held by another
// mission) is a segment of its own, its Why saying which.
package waterfall
