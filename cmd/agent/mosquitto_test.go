package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/broker/brokertest"
)

// TestMosquittoRestartsLoseNoTrigger: with Debian's mosquitto as the
// broker, restarted 20 times while an app publishes a trigger every 50 ms
// at QoS 1, every trigger the broker acknowledged gets a reply, and no
// request becomes two missions. The app does what docs/protocol.md asks:
// a persistent session for its replies, and the same request_id sent
// again when no reply comes.
func TestMosquittoRestartsLoseNoTrigger(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a broker 20 times")
	}
	// Its own broker, home and agent: it runs beside the other long loops.
	t.Parallel()
	mq := brokertest.StartMosquitto(t, true)
	e := newBareEnv(t, "mq")
	e.connect(mq.URL())
	e.writeConfig(fmt.Sprintf("embedded = false\nurl = %q\n", mq.URL()), "")
	e.start()

	app := newTriggerApp(t, mq.URL(), "mq")
	app.flow(50 * time.Millisecond)
	for i := range 20 {
		time.Sleep(300 * time.Millisecond) // triggers flow between restarts
		mq.Stop()
		// The broker is down a moment, sometimes long enough for the
		// agent's reconnection to back off past its return: triggers then
		// reach a broker the agent is not connected to.
		time.Sleep(time.Duration(100+400*(i%4)) * time.Millisecond)
		mq.Start()
	}
	time.Sleep(500 * time.Millisecond) // a last stretch with the broker up
	ids := app.halt()

	// Replies come by subscription; one the agent published while the
	// broker was going down can be lost, and the app then sends the same
	// request again, as docs/protocol.md says. The answer to that must be
	// a duplicate: the trigger itself was not lost.
	resent := app.answerAll(ids)
	for _, id := range ids {
		switch r := app.reply(id); {
		case r == nil:
			t.Errorf("acknowledged trigger %s got no reply, even sent again", id)
		case app.lost(id):
			t.Errorf("trigger %s, acknowledged by the broker, was lost: sent again, it made its first mission (%v)", id, r)
		}
	}

	perRequest, _ := e.missionsByRequest()
	for id, n := range perRequest {
		if n > 1 {
			t.Errorf("request %s made %d missions", id, n)
		}
	}
	accepted := 0
	for _, id := range ids {
		if perRequest[id] == 1 {
			accepted++
		}
	}
	t.Logf("%d triggers acknowledged by mosquitto over 20 restarts: %d missions, none twice; %d replies lost on the way back and answered when sent again", len(ids), accepted, len(resent))
}
