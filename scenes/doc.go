// Package scenes turns named scenes ("go_home", "good_night") into
// driver missions.
//
// Scenes are written in TOML, one or more per file, in a directory of
// *.toml files (docs/scenes.md is the format reference). Load reads the
// directory, validates every scene against the device registry and
// reports every problem it finds at once, each naming its file, scene,
// step and field, so a broken scene is caught when the agent starts, not
// when somebody says "good night".
//
// A Catalog is the loaded, validated set. Build resolves a trigger's
// parameters against a scene and returns a driver.Spec; a bad trigger is
// rejected with a *TriggerError before any mission exists. DecodeTrigger
// reads the JSON a voice assistant or app publishes, and Reply is the
// answer the agent publishes back.
//
// DelayHandler is the driver.Handler for "delay" steps. It holds no
// worker while it waits: it answers "not ready" until the delay has
// passed, measuring from the step's start, so it survives restarts.
//
// A Catalog is read-only after Load and safe for concurrent use.
package scenes
