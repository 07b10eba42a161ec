package uplink

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/bundle"
)

func sampleOffer(t testing.TB) (BundleOffer, []byte) {
	t.Helper()
	b, err := bundle.New("", []bundle.File{{Path: "devices.toml", Data: []byte("#\n")}, {Path: "scenes/a.toml", Data: []byte("#\n")}})
	if err != nil {
		t.Fatal(err)
	}
	enc, err := b.Encode()
	if err != nil {
		t.Fatal(err)
	}
	o := BundleOffer{Hash: b.Hash(), Version: 3, Rollout: "r1", Bundle: enc}
	msg, err := json.Marshal(Control{ID: "c1", Action: ActionBundle, Bundle: &o})
	if err != nil {
		t.Fatal(err)
	}
	return o, msg
}

func TestBundleOfferDecodesWithItsBytesIntact(t *testing.T) {
	o, msg := sampleOffer(t)
	c, err := DecodeControl(msg)
	if err != nil {
		t.Fatal(err)
	}
	if c.Bundle == nil || string(c.Bundle.Bundle) != string(o.Bundle) || c.Bundle.Version != 3 {
		t.Fatalf("got %+v", c.Bundle)
	}
	if _, err := bundle.Decode(c.Bundle.Bundle); err != nil {
		t.Fatalf("the bundle inside does not decode: %v", err)
	}
}

func TestBundleOfferRefusedWhenItsBytesDoNotMatchItsHash(t *testing.T) {
	o, _ := sampleOffer(t)
	for name, mutate := range map[string]func(o *BundleOffer){
		"other hash":    func(o *BundleOffer) { o.Hash = strings.Repeat("0", 64) },
		"short hash":    func(o *BundleOffer) { o.Hash = "abc" },
		"version 0":     func(o *BundleOffer) { o.Version = 0 },
		"soak too long": func(o *BundleOffer) { o.SoakSeconds = 1e6 },
	} {
		t.Run(name, func(t *testing.T) {
			bad := o
			mutate(&bad)
			msg, err := json.Marshal(Control{ID: "c1", Action: ActionBundle, Bundle: &bad})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := DecodeControl(msg); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func TestBundleOfferRefusedWhenItsBytesWereReformatted(t *testing.T) {
	_, msg := sampleOffer(t)
	spaced := strings.Replace(string(msg), `"format":1`, `"format": 1`, 1)
	if spaced == string(msg) {
		t.Fatal("test broken: nothing replaced")
	}
	if _, err := DecodeControl([]byte(spaced)); err == nil || !strings.Contains(err.Error(), "hash to") {
		t.Fatalf("err = %v", err)
	}
}

func TestHeartbeatConfigIsOptionalBothWays(t *testing.T) {
	old := []byte(`{"gateway":"gw","version":"v1","uptime_seconds":1,"backlog":0,"active_missions":0,"devices":[],"time":"2026-01-01T00:00:00Z"}`)
	h, err := DecodeHeartbeat(old)
	if err != nil || h.Config != nil {
		t.Fatalf("an old gateway's heartbeat: %+v, %v", h, err)
	}
	h.Config = &ConfigState{Hash: strings.Repeat("a", 64), Source: SourceHub, Version: 4, Since: time.Unix(0, 0).UTC()}
	b, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	// An old hub decodes into a struct without the field: unknown keys
	// are ignored by the decoder it shares.
	var before struct {
		Gateway string `json:"gateway"`
	}
	if err := decode(b, &before); err != nil || before.Gateway != "gw" {
		t.Fatalf("an old hub's decode: %v", err)
	}
	again, err := DecodeHeartbeat(b)
	if err != nil || again.Config == nil || again.Config.Version != 4 {
		t.Fatalf("round trip: %+v, %v", again.Config, err)
	}
}

func FuzzDecodeBundleControl(f *testing.F) {
	_, msg := sampleOffer(f)
	f.Add(msg)
	addSeeds(f,
		`{"id":"c1","action":"bundle"}`,
		`{"id":"c1","action":"bundle","bundle":{"hash":"`+strings.Repeat("0", 64)+`","version":1,"bundle":{}}}`,
	)
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeControl(b)
		checkErr(t, err)
		if err != nil || c.Action != ActionBundle {
			return
		}
		if c.Bundle == nil || c.Bundle.Version == 0 || bundle.HashOf(c.Bundle.Bundle) != c.Bundle.Hash {
			t.Fatalf("accepted offer %+v", c.Bundle)
		}
	})
}

func FuzzDecodeBundleStatus(f *testing.F) {
	h := strings.Repeat("ab", 32)
	addSeeds(f,
		`{"gateway":"gw","hash":"`+h+`","version":2,"status":"applied","current":"`+h+`","at":"2026-01-01T00:00:00Z"}`,
		`{"gateway":"gw","hash":"`+h+`","version":2,"status":"reverted","reason":"devices_silent","message":"lamp_9 silent"}`,
		`{"gateway":"gw","hash":"`+h+`","version":2,"status":"rejected"}`,
		`{"gateway":"g/w","hash":"`+h+`","status":"healthy"}`,
	)
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeBundleStatus(b)
		checkErr(t, err)
		if err != nil {
			return
		}
		if (s.Status == BundleRejected || s.Status == BundleReverted) && s.Reason == "" {
			t.Fatalf("accepted %+v", s)
		}
		again, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeBundleStatus(again); err != nil {
			t.Fatalf("re-encoded status rejected: %v", err)
		}
	})
}
