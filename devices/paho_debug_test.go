package devices_test

import (
	"log"
	"os"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// init turns on paho's internal logs when PAHO_DEBUG is set, for chasing
// connection problems in the tests.
func init() {
	if os.Getenv("PAHO_DEBUG") != "" {
		mqtt.DEBUG = log.New(os.Stderr, "D ", log.Lmicroseconds)
		mqtt.ERROR = log.New(os.Stderr, "E ", log.Lmicroseconds)
		mqtt.WARN = log.New(os.Stderr, "W ", log.Lmicroseconds)
	}
}
