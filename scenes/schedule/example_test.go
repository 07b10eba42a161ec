package schedule_test

import (
	"fmt"
	"time"

	"github.com/sortie-edge/sortie/scenes/schedule"
)

func ExampleCron_Next() {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		panic(err)
	}
	c, err := schedule.ParseCron("30 2 * * *")
	if err != nil {
		panic(err)
	}
	t := time.Date(2026, 3, 28, 12, 0, 0, 0, berlin)
	for range 3 {
		t = c.Next(t, berlin)
		fmt.Println(t.Format("Mon 2006-01-02 15:04 MST"))
	}
	// Output:
	// Sun 2026-03-29 03:00 CEST
	// Mon 2026-03-30 02:30 CEST
	// Tue 2026-03-31 02:30 CEST
}

func ExampleParseCron_error() {
	_, err := schedule.ParseCron("0 0 31 4,6,9,11 *")
	fmt.Println(err)
	// Output:
	// cron "0 0 31 4,6,9,11 *": day-of-month: "31": never matches: no month in "4,6,9,11" has such a day
}

func ExampleSun_Next() {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		panic(err)
	}
	s := schedule.Sun{Event: schedule.Sunset, Offset: -15 * time.Minute, Lat: 52.52, Lon: 13.405}
	if err := s.Validate(); err != nil {
		panic(err)
	}
	fmt.Println(s)
	fmt.Println(s.Next(time.Date(2026, 6, 21, 12, 0, 0, 0, berlin), berlin).Format("2006-01-02 15:04 MST"))
	// Output:
	// sunset-15m0s at 52.52,13.405
	// 2026-06-21 21:18 CEST
}
