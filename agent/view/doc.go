// Package view draws the agent's missions, devices and scenes as text for
// a terminal: the live progress lines of the demo (Progress, a
// driver.Observer), a mission's timeline (Mission) and the CLI's tables.
// Its functions are pure, so they are golden-tested (testdata/).
package view
