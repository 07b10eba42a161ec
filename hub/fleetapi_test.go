package hub

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/uplink"
)

// TestFleetAPIStoresShowsAndRefusesBundles: the bundle endpoints over
// HTTP: a push, its release found by version and by a short hash, a
// bundle the agent's rules refuse answered 422 with the problem, a
// rollout spec refused 400, a rollout to an unknown gateway 404, and
// the fleet and groups listed.
func TestFleetAPIStoresShowsAndRefusesBundles(t *testing.T) {
	e := newEnv(t, "home")
	b := testBundle(t, "", "")
	enc, _ := b.Encode()
	var pushed struct {
		Release Release `json:"release"`
		Created bool    `json:"created"`
	}
	if code := e.do(t, http.MethodPost, "/api/bundles?group=lab", string(enc), &pushed); code != http.StatusCreated || !pushed.Created || pushed.Release.Group != "lab" {
		t.Fatalf("push: %d %+v", code, pushed)
	}
	for _, ref := range []string{"1", bundle.Short(b.Hash()), b.Hash()} {
		var info BundleInfo
		if code := e.do(t, http.MethodGet, "/api/bundles/"+ref, "", &info); code != http.StatusOK || info.Hash != b.Hash() || len(info.Releases) != 1 {
			t.Fatalf("GET /api/bundles/%s: %d %+v", ref, code, info)
		}
	}
	if code := e.do(t, http.MethodGet, "/api/bundles/99", "", nil); code != http.StatusNotFound {
		t.Fatalf("an unknown version: %d, want 404", code)
	}
	files := append([]bundle.File(nil), b.Files...)
	files = append(files, bundle.File{Path: "scenes/zz.toml", Data: []byte("[[scene]]\nname = \"zz\"\n[[scene.step]]\ndevice = \"no_such_lamp\"\naction = \"turn_on\"\n")})
	bad, err := bundle.New("", files)
	if err != nil {
		t.Fatal(err)
	}
	badEnc, _ := bad.Encode()
	status, body, err := e.request(http.MethodPost, "/api/bundles", string(badEnc))
	if err != nil || status != http.StatusUnprocessableEntity || !strings.Contains(string(body), "no_such_lamp") {
		t.Fatalf("push of an invalid bundle: %d %s %v", status, body, err)
	}
	if code := e.do(t, http.MethodPost, "/api/rollouts", `{"group":"lab","factor":99}`, nil); code != http.StatusBadRequest {
		t.Fatalf("a factor of 99: %d, want 400", code)
	}
	if code := e.do(t, http.MethodPost, "/api/rollouts", `{"group":"lab","gateways":["nowhere"]}`, nil); code != http.StatusNotFound {
		t.Fatalf("an unknown gateway: %d, want 404", code)
	}
	var fleet struct {
		Gateways []FleetGateway `json:"gateways"`
	}
	if code := e.do(t, http.MethodPut, "/api/gateways/home/tags", `{"tags":["lab","b"]}`, nil); code != http.StatusOK {
		t.Fatalf("tags: %d", code)
	}
	if code := e.do(t, http.MethodGet, "/api/fleet", "", &fleet); code != http.StatusOK || len(fleet.Gateways) != 1 || strings.Join(fleet.Gateways[0].Tags, ",") != "b,lab" {
		t.Fatalf("fleet: %d %+v", code, fleet)
	}
	var groups struct {
		Groups []Group `json:"groups"`
	}
	if code := e.do(t, http.MethodGet, "/api/groups", "", &groups); code != http.StatusOK || len(groups.Groups) != 1 || groups.Groups[0].DriftPolicy != DriftAlert {
		t.Fatalf("groups: %d %+v", code, groups)
	}
	if code := e.do(t, http.MethodPut, "/api/groups/lab", `{"drift_policy":"sometimes"}`, nil); code != http.StatusBadRequest {
		t.Fatalf("a policy that is not one: %d, want 400", code)
	}
}

// noFleet is a backend without a rollout engine (the cluster mode's).
type noFleet struct{ Backend }

func TestFleetEndpointsSayTheClusterModeHasNoRollouts(t *testing.T) {
	e := newEnv(t)
	srv := httptest.NewServer(NewAPIOn(noFleet{e.svc}, e.st, APIOptions{Token: testToken}))
	t.Cleanup(srv.Close)
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/api/rollouts", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close() // the status is the answer
	if res.StatusCode != http.StatusNotImplemented {
		t.Fatalf("GET /api/rollouts: %d, want 501", res.StatusCode)
	}
}

func TestANewerRolloutOfTheGroupSupersedesTheActiveOne(t *testing.T) {
	r := newFleetRig(t)
	base := r.push(testBundle(t, "", ""))
	r.push(testBundle(t, "v2", ""))
	r.online(base.Hash, gatewayIDs(4)...)
	first, err := r.f.StartRollout(context.Background(), RolloutSpec{})
	if err != nil {
		t.Fatal(err)
	}
	r.step()
	r.take()
	v3 := r.push(testBundle(t, "v3", ""))
	second, err := r.f.StartRollout(context.Background(), RolloutSpec{})
	if err != nil {
		t.Fatal(err)
	}
	if v := r.view(first.ID); v.State != RolloutSuperseded || v.Counts[TargetSuperseded] != 4 {
		t.Fatalf("first rollout %s %v, want superseded, its 4 gateways too", v.State, v.Counts)
	}
	r.step()
	sent := r.take()
	if len(sent) != 1 || sent[0].c.Bundle.Hash != v3.Hash || second.Version != v3.Version {
		t.Fatalf("offers %v, want the second rollout's canary of v3", sent)
	}
}

func TestAFailureThatMayPassIsRetriedAsANewRelease(t *testing.T) {
	r := newFleetRig(t)
	_, next, v, o := r.startOne()
	r.f.NoteStatus("gw-1", uplink.BundleStatus{Gateway: "gw-1", Hash: next.Hash, Version: o.c.Bundle.Version, Rollout: o.c.Bundle.Rollout,
		Status: uplink.BundleRejected, Reason: uplink.ReasonStorage, Current: strings.Repeat("0", 64), At: r.clock.Now()})
	r.step()
	if got := r.take(); len(got) != 0 {
		t.Fatalf("retried with Retries 0: %v", got)
	}
	if tg := r.view(v.ID).Gateways[0]; tg.Status != TargetFailed || tg.Reason != uplink.ReasonStorage {
		t.Fatalf("target %s %s, want failed: storage", tg.Status, tg.Reason)
	}

	r2 := newFleetRig(t)
	base := r2.push(testBundle(t, "", ""))
	next = r2.push(testBundle(t, "v2", ""))
	r2.online(base.Hash, "gw-1")
	v, err := r2.f.StartRollout(context.Background(), RolloutSpec{Retries: 1, Soak: driver.Duration(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	r2.step()
	o = r2.take()[0]
	r2.f.NoteStatus("gw-1", uplink.BundleStatus{Gateway: "gw-1", Hash: next.Hash, Version: o.c.Bundle.Version, Rollout: o.c.Bundle.Rollout,
		Status: uplink.BundleRejected, Reason: uplink.ReasonStorage, At: r2.clock.Now()})
	r2.step()
	again := r2.take()
	if len(again) != 1 || again[0].c.Bundle.Hash != next.Hash || again[0].c.Bundle.Version <= o.c.Bundle.Version || again[0].c.ID == o.c.ID {
		t.Fatalf("retry %v, want the same bundle as a newer release under a new control ID", again)
	}
	r2.answer(again[0], uplink.BundleReceived, uplink.BundleApplied, uplink.BundleHealthy)
	r2.step()
	r2.clock.add(time.Second)
	r2.step()
	if v = r2.view(v.ID); v.State != RolloutCompleted || v.Gateways[0].Offers != 2 {
		t.Fatalf("rollout %s, offers %d: want completed after 2 offers", v.State, v.Gateways[0].Offers)
	}
}

func TestAPausedRolloutNotifiesNoMoreGateways(t *testing.T) {
	r := newFleetRig(t)
	base := r.push(testBundle(t, "", ""))
	r.push(testBundle(t, "v2", ""))
	r.online(base.Hash, gatewayIDs(3)...)
	v, err := r.f.StartRollout(context.Background(), RolloutSpec{Soak: driver.Duration(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	r.step()
	canary := r.take()
	if _, err := r.f.Pause(context.Background(), v.ID); err != nil {
		t.Fatal(err)
	}
	r.answer(canary[0], uplink.BundleReceived, uplink.BundleApplied, uplink.BundleHealthy)
	r.step()
	r.clock.add(time.Hour)
	r.step()
	if got := r.take(); len(got) != 0 {
		t.Fatalf("offers while paused: %v", got)
	}
	if v = r.view(v.ID); v.State != RolloutPaused || v.Counts[TargetHealthy] != 1 {
		t.Fatalf("%s %v, want paused with the canary's outcome recorded", v.State, v.Counts)
	}
	if _, err := r.f.Resume(context.Background(), v.ID, false); err != nil {
		t.Fatal(err)
	}
	r.step()
	if got := r.take(); len(got) != 2 {
		t.Fatalf("%d offers after resume, want the next wave's 2", len(got))
	}
}
