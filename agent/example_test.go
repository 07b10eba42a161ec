package agent_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/scenes"
)

// An agent embedded in another program: its device registry and scenes,
// an embedded broker on a free port, no management API. Run blocks
// until the context ends; Close releases the store and the broker.
func Example() {
	reg, err := devices.LoadRegistry("../configs/devices.toml")
	if err != nil {
		log.Fatal(err)
	}
	cat, err := scenes.Load("../configs/scenes", reg)
	if err != nil {
		log.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "sortie-example")
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(dir) }() // a temporary directory; nothing to keep

	a, err := agent.New(agent.Options{
		Gateway: "home", DataDir: dir, Registry: reg, Catalog: cat,
		Broker: agent.BrokerOptions{Embedded: true, Listen: "127.0.0.1:0"},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	if err := a.Start(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("triggers on", a.Addrs().TriggerTopic)
	fmt.Println("scenes:", a.Addrs().Scenes)
	cancel() // in a real program: on SIGTERM
	if err := a.Run(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// triggers on sortie/gateways/home/trigger
	// scenes: [all_off go_home good_night leave_home movie_night]
}
