package main

import (
	"syscall"
	"testing"
)

// TestTriggerPublishedWhileTheAgentIsAwayIsAnswered: with an external
// broker, the agent's trigger subscription is a persistent session, so a
// trigger an app publishes while the agent is stopped (the broker
// acknowledges it) waits on the broker, and the agent answers it, with a
// mission, when it is back; sending it again then is a duplicate.
func TestTriggerPublishedWhileTheAgentIsAwayIsAnswered(t *testing.T) {
	e := newEnv(t, "")
	p := e.start()
	e.trigger("go_home", "before", nil) // the session exists on the broker
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("agent exited %d", code)
	}
	e.publish(`{"scene":"movie_night","request_id":"while-away","source":"test"}`)
	e.start()
	r := e.reply("while-away")
	if r["status"] != "accepted" || r["mission_id"] == "" || r["duplicate"] == true {
		t.Fatalf("reply to the trigger sent while the agent was away: %v; want a new mission", r)
	}
	e.publish(`{"scene":"movie_night","request_id":"while-away","source":"test"}`)
	if again := e.reply("while-away"); again["mission_id"] != r["mission_id"] || again["duplicate"] != true {
		t.Errorf("the same request sent again: %v; want a duplicate of %v", again, r["mission_id"])
	}
}
