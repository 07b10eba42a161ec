package shelly

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/sortie-edge/sortie/devices/adapter"
)

// The golden frames in testdata/ come from Shelly's API documentation
// (RPCProtocol, Notifications, Switch, CommonErrors) and from real
// devices' captures in ioBroker.shelly's issues; ids and src are set to
// Sortie's where the frame answers a request of ours:
//
//	request-switch-set-iobroker.json  ioBroker.shelly #1055, a Shelly Plus 1
//	reply-switch-set.json             the reply 38 ms later in the same capture
//	reply-error-103.json              CommonErrors: -103 INVALID ARGUMENT
//	notify-status-power.json          ioBroker.shelly #1592, a 1PM Mini Gen3 (only changed fields)
//	notify-status-output.json         Notifications: an output change
//	status-switch.json                Switch.GetStatus and status/switch:0
func golden(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newTestProtocol(t testing.TB) *Protocol {
	t.Helper()
	p, err := New(Settings{Src: "sortie"}, []adapter.Device{
		{ID: "relay", Address: "shellyplus1-4855199bc0e8", Keys: []string{"power"}},
		{ID: "mini", Address: "shelly1pmminig3-543204xxxxxx", Keys: []string{"power"}},
		{ID: "blind", Address: "shellyplus2pm-aabbcc:0", Keys: []string{"position"}},
		{ID: "pro", Address: "shellypro4pm-f008d1d8b8b8", Keys: []string{"power"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCommandIsAnIdempotentSetWithSortiesSrc(t *testing.T) {
	p := newTestProtocol(t)
	msgs, err := p.Command("relay", map[string]any{"power": "off"}, "c1")
	if err != nil {
		t.Fatal(err)
	}
	var got, want map[string]any
	if err := json.Unmarshal(msgs[0].Payload, &got); err != nil {
		t.Fatal(err)
	}
	// The capture's request, with Sortie's id and src.
	if err := json.Unmarshal(golden(t, "request-switch-set-iobroker.json"), &want); err != nil {
		t.Fatal(err)
	}
	want["id"], want["src"] = "c1", "sortie"
	if msgs[0].Topic != "shellyplus1-4855199bc0e8/rpc" || !reflect.DeepEqual(got, want) {
		t.Errorf("got %s %v, want %v", msgs[0].Topic, got, want)
	}
	msgs, _ = p.Command("blind", map[string]any{"position": 40}, "c2")
	if string(msgs[0].Payload) != `{"id":"c2","method":"Cover.GoToPosition","params":{"id":0,"pos":40},"src":"sortie"}` {
		t.Errorf("cover request %s", msgs[0].Payload)
	}
}

func TestReplyIsTheAckAndCarriesThePriorState(t *testing.T) {
	p := newTestProtocol(t)
	if _, err := p.Command("relay", map[string]any{"power": "off"}, "c1"); err != nil {
		t.Fatal(err)
	}
	got, err := p.Decode(adapter.Message{Topic: "sortie/rpc", Payload: golden(t, "reply-switch-set.json")})
	if err != nil {
		t.Fatal(err)
	}
	want := []adapter.Report{{Device: "relay", Availability: adapter.Online, Reply: &adapter.Reply{ID: "c1", Prior: map[string]any{"power": "on"}}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	// The same reply again answers nothing: its request is settled.
	if got, _ := p.Decode(adapter.Message{Topic: "sortie/rpc", Payload: golden(t, "reply-switch-set.json")}); len(got) != 0 {
		t.Errorf("a repeated reply: %+v", got)
	}
}

func TestErrorReplyIsClassified(t *testing.T) {
	p := newTestProtocol(t)
	if _, err := p.Command("pro", map[string]any{"power": "on"}, "c1"); err != nil {
		t.Fatal(err)
	}
	got, err := p.Decode(adapter.Message{Topic: "sortie/rpc", Payload: golden(t, "reply-error-103.json")})
	if err != nil || len(got) != 1 || got[0].Reply == nil || got[0].Reply.Failure == nil || got[0].Reply.Failure.Code != "invalid_param" {
		t.Fatalf("got %+v, %v; want an invalid_param failure", got, err)
	}
	for code, want := range map[int]string{-103: "invalid_param", -105: "unsupported", -109: "unsupported", 401: "unsupported", 404: "unsupported", -108: "busy", -114: "busy", -104: "internal", -1: "internal"} {
		if got := Classify(code); got != want {
			t.Errorf("Classify(%d) = %s, want %s", code, got, want)
		}
	}
}

func TestAReplyFromAnotherDeviceIsIgnored(t *testing.T) {
	p := newTestProtocol(t)
	if _, err := p.Command("relay", map[string]any{"power": "off"}, "c1"); err != nil {
		t.Fatal(err)
	}
	// Another Shelly, which may also publish on Sortie's src, answers
	// for the relay.
	forged := []byte(`{"id":"c1","src":"shellypro4pm-f008d1d8b8b8","dst":"sortie","result":{"was_on":true}}`)
	if got, _ := p.Decode(adapter.Message{Topic: "sortie/rpc", Payload: forged}); len(got) != 0 {
		t.Fatalf("a reply from another device was taken: %+v", got)
	}
	// The relay's own still counts.
	if got, _ := p.Decode(adapter.Message{Topic: "sortie/rpc", Payload: golden(t, "reply-switch-set.json")}); len(got) != 1 {
		t.Fatalf("the relay's own reply: %+v", got)
	}
}

func TestNotificationsAndStatusUpdateTheState(t *testing.T) {
	p := newTestProtocol(t)
	got, err := p.Decode(adapter.Message{Topic: "shellyplus1-4855199bc0e8/events/rpc", Payload: golden(t, "notify-status-output.json")})
	if err != nil || len(got) != 1 || got[0].State["power"] != "off" {
		t.Fatalf("NotifyStatus: %+v, %v", got, err)
	}
	// A notification of power figures only says nothing of the output.
	got, err = p.Decode(adapter.Message{Topic: "shelly1pmminig3-543204xxxxxx/events/rpc", Payload: golden(t, "notify-status-power.json")})
	if err != nil || len(got) != 0 {
		t.Fatalf("NotifyStatus without output: %+v, %v", got, err)
	}
	got, err = p.Decode(adapter.Message{Topic: "shellyplus1-4855199bc0e8/status/switch:0", Payload: golden(t, "status-switch.json")})
	if err != nil || len(got) != 1 || got[0].State["power"] != "off" {
		t.Fatalf("status/switch:0: %+v, %v", got, err)
	}
	got, _ = p.Decode(adapter.Message{Topic: "shellyplus2pm-aabbcc/status/cover:0", Payload: []byte(`{"id":0,"state":"closing","current_pos":55}`)})
	if len(got) != 1 || got[0].State["position"] != int64(55) || got[0].State["moving"] != true {
		t.Fatalf("a closing cover: %+v", got)
	}
	got, _ = p.Decode(adapter.Message{Topic: "shellyplus1-4855199bc0e8/online", Payload: []byte("false")})
	if len(got) != 1 || got[0].Availability != adapter.Offline {
		t.Fatalf("online false: %+v", got)
	}
}

func TestACoverReplyOnlySaysItStarted(t *testing.T) {
	p := newTestProtocol(t)
	if _, err := p.Command("blind", map[string]any{"position": 40}, "c1"); err != nil {
		t.Fatal(err)
	}
	got, _ := p.Decode(adapter.Message{Topic: "sortie/rpc", Payload: []byte(`{"id":"c1","src":"shellyplus2pm-aabbcc","dst":"sortie","result":null}`)})
	if len(got) != 1 || got[0].Reply != nil {
		t.Fatalf("got %+v: a cover's reply must not confirm the command", got)
	}
}

func FuzzDecode(f *testing.F) {
	for _, name := range []string{"reply-switch-set.json", "reply-error-103.json", "notify-status-power.json", "notify-status-output.json", "status-switch.json"} {
		f.Add("sortie/rpc", golden(f, name))
		f.Add("shellyplus1-4855199bc0e8/events/rpc", golden(f, name))
		f.Add("shellyplus1-4855199bc0e8/status/switch:0", golden(f, name))
	}
	f.Add("shellyplus2pm-aabbcc/status/cover:0", []byte(`{"state":"opening","current_pos":3}`))
	f.Fuzz(func(t *testing.T, topic string, payload []byte) {
		p := newTestProtocol(t)
		if _, err := p.Command("relay", map[string]any{"power": "on"}, "c1"); err != nil {
			t.Fatal(err)
		}
		reports, err := p.Decode(adapter.Message{Topic: topic, Payload: payload})
		if err != nil && reports != nil {
			t.Fatalf("reports with an error: %v", err)
		}
		for _, r := range reports {
			if p.byID[r.Device] == nil {
				t.Fatalf("a report for %q", r.Device)
			}
			if r.Reply != nil && r.Reply.ID != "c1" {
				t.Fatalf("a reply to %q, a request never made", r.Reply.ID)
			}
		}
	})
}
