package broker

import (
	"slices"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/sortie-edge/sortie/broker/passwd"
)

// TestAuthRefusesWhatItsRuleDoesNotAllow pins the hook's contract with
// a real broker and real clients: a wrong password, a client ID that is
// another user's name, and a subscription outside the rule are refused
// and reported with their reasons; the rule's own topics and the
// internal identity's everything are allowed.
func TestAuthRefusesWhatItsRuleDoesNotAllow(t *testing.T) {
	book := lampBook(t)
	var mu sync.Mutex
	var refused []string
	b := startWithAuth(t, AuthOptions{
		Users:    book,
		Internal: "self", InternalPassword: "self-password",
		Allow: func(user, topic string, write bool) bool { return !write && topic == user+"/cmd" },
		Refused: func(reason string) {
			mu.Lock()
			refused = append(refused, reason)
			mu.Unlock()
		},
	})

	connect := func(id, user, pass string) (paho.Client, error) {
		cl := paho.NewClient(paho.NewClientOptions().AddBroker(b.URL()).SetClientID(id).
			SetUsername(user).SetPassword(pass).SetAutoReconnect(false).SetConnectRetry(false).
			SetProtocolVersion(4)) // else paho retries a refusal as MQTT 3.1
		tok := cl.Connect()
		if !tok.WaitTimeout(5 * time.Second) {
			t.Fatal("connect timed out")
		}
		return cl, tok.Error()
	}
	if _, err := connect("lamp", "lamp", "wrong-password"); err == nil {
		t.Error("a wrong password was let in")
	}
	if _, err := connect("lamp.1", "self", "self-password"); err == nil {
		t.Error("the internal identity took a client ID reserved to the user lamp")
	}
	lamp, err := connect("lamp", "lamp", "lamp-password")
	if err != nil {
		t.Fatalf("the right password was refused: %v", err)
	}
	defer lamp.Disconnect(0)
	sub := func(cl paho.Client, filter string) byte {
		tok := cl.Subscribe(filter, 1, func(paho.Client, paho.Message) {})
		if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatalf("subscribe %s: %v", filter, tok.Error())
		}
		return tok.(*paho.SubscribeToken).Result()[filter]
	}
	if got := sub(lamp, "lamp/cmd"); got != 1 {
		t.Errorf("subscription the rule allows: SUBACK code %#x, want 1", got)
	}
	if got := sub(lamp, "other/cmd"); got != 0x80 {
		t.Errorf("subscription outside the rule: SUBACK code %#x, want 0x80", got)
	}
	self, err := connect("self-1", "self", "self-password")
	if err != nil {
		t.Fatalf("the internal identity was refused: %v", err)
	}
	defer self.Disconnect(0)
	if got := sub(self, "#"); got != 1 {
		t.Errorf("the internal identity's #: SUBACK code %#x, want 1", got)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{RefusedLogin, RefusedClientID, RefusedSubscribe}
	if !slices.Equal(refused, want) {
		t.Errorf("refusals %v, want %v", refused, want)
	}
}

func TestNewAuthRejectsIncompleteOptions(t *testing.T) {
	allow := func(string, string, bool) bool { return true }
	for name, o := range map[string]AuthOptions{
		"no users":              {Allow: allow},
		"no rule":               {Users: passwd.NewBook()},
		"internal, no password": {Users: passwd.NewBook(), Allow: allow, Internal: "self"},
	} {
		if _, err := NewAuth(o); err == nil {
			t.Errorf("%s: NewAuth accepted it", name)
		}
	}
}

// lampBook is a password book with one user, "lamp", whose password is
// "lamp-password" (hashed cheaply: this is a test).
func lampBook(t *testing.T) *passwd.Book {
	t.Helper()
	h, err := passwd.HashCost("lamp-password", 1000)
	if err != nil {
		t.Fatal(err)
	}
	c, err := passwd.Parse(h)
	if err != nil {
		t.Fatal(err)
	}
	book := passwd.NewBook()
	book.Add("lamp", c)
	return book
}

// startWithAuth starts a broker on a free port with the Auth hook opts
// make, closed when the test ends.
func startWithAuth(t *testing.T, opts AuthOptions) *Broker {
	t.Helper()
	a, err := NewAuth(opts)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Start(Options{Addr: "127.0.0.1:0", Auth: a})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() }) // the broker's shutdown is not under test
	return b
}
