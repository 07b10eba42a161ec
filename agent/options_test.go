package agent

import (
	"strings"
	"testing"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/scenes"
)

// TestNewRejectsIncompleteOptions: an embedder that leaves out what the
// agent cannot run without, or gives the embedded broker bad users, is
// told so by New, before anything is opened.
func TestNewRejectsIncompleteOptions(t *testing.T) {
	reg, err := devices.LoadRegistry(testkit.RepoPath("configs/devices.toml"))
	if err != nil {
		t.Fatal(err)
	}
	cat, err := scenes.Load(testkit.RepoPath("configs/scenes"), reg)
	if err != nil {
		t.Fatal(err)
	}
	good := func() Options {
		return Options{Gateway: "home", DataDir: t.TempDir(), Registry: reg, Catalog: cat, Broker: BrokerOptions{Embedded: true}}
	}
	if _, err := New(good()); err != nil {
		t.Fatalf("New(good options): %v", err)
	}
	hash := testHash(t, "a-good-password")
	for _, c := range []struct {
		name   string
		change func(*Options)
		want   string
	}{
		{"no gateway", func(o *Options) { o.Gateway = "" }, "gateway"},
		{"gateway with a slash", func(o *Options) { o.Gateway = "a/b" }, "gateway"},
		{"no data directory", func(o *Options) { o.DataDir = "" }, "data directory"},
		{"no registry", func(o *Options) { o.Registry = nil }, "registry"},
		{"external broker without URL", func(o *Options) { o.Broker.Embedded = false }, "neither embedded nor a URL"},
		{"users on an external broker", func(o *Options) {
			o.Broker = BrokerOptions{URL: "tcp://127.0.0.1:1883", Users: []BrokerUser{{Name: "voice", Role: RoleApp, PasswordHash: hash}}}
		}, "users are for the embedded broker"},
		{"hub without URL", func(o *Options) { o.Hub = &HubOptions{} }, "hub: no URL"},
		{"a user with the agent's own name", func(o *Options) {
			o.Broker.Users = []BrokerUser{{Name: InternalUser, Role: RoleAdmin, PasswordHash: hash}}
		}, "the agent's own"},
		{"a device user not in the registry", func(o *Options) {
			o.Broker.Users = []BrokerUser{{Name: "garage-door", Role: RoleDevice, PasswordHash: hash}}
		}, "not in the device registry"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := good()
			c.change(&o)
			_, err := New(o)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New: %v, want an error saying %q", err, c.want)
			}
		})
	}
}

// TestCheckUsersNamesEveryProblem: each bad user is reported with its
// index and field, all of them at once.
func TestCheckUsersNamesEveryProblem(t *testing.T) {
	hash := testHash(t, "a-good-password")
	errs := CheckUsers([]BrokerUser{
		{Name: "voice", Role: RoleApp, PasswordHash: hash},
		{Name: "voice", Role: RoleApp, PasswordHash: hash},
		{Name: "bad/name", Role: RoleDevice, PasswordHash: hash},
		{Name: "ops", Role: "root", PasswordHash: "plain"},
		{Name: "nohash", Role: RoleApp},
	})
	var got []string
	for _, e := range errs {
		got = append(got, e.Field+"@"+string(rune('0'+e.Index)))
	}
	want := "name@1 name@2 role@3 password_hash@3 password_hash@4"
	if strings.Join(got, " ") != want {
		t.Errorf("problems %v, want %s", got, want)
	}
}
