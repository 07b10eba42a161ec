package bundle_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/sortie-edge/sortie/bundle"
)

func sample(t testing.TB) *bundle.Bundle {
	t.Helper()
	b, err := bundle.New("v0.1.0", []bundle.File{
		{Path: "scenes/b.toml", Data: []byte("# b\n")},
		{Path: "devices.toml", Data: []byte("# registry\n")},
		{Path: "scenes/a.toml", Data: []byte("# a\n")},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestEncodingRoundTripsAndKeepsTheHash(t *testing.T) {
	b := sample(t)
	enc, err := b.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := bundle.Decode(enc)
	if err != nil {
		t.Fatal(err)
	}
	if got.Hash() != b.Hash() || bundle.HashOf(enc) != b.Hash() || len(b.Hash()) != 64 {
		t.Fatalf("hashes differ: %s %s %s", got.Hash(), bundle.HashOf(enc), b.Hash())
	}
	if paths := []string{got.Files[0].Path, got.Files[1].Path, got.Files[2].Path}; strings.Join(paths, ",") != "devices.toml,scenes/a.toml,scenes/b.toml" {
		t.Fatalf("files not sorted: %v", paths)
	}
}

func TestHashChangesWithAnyByte(t *testing.T) {
	b := sample(t)
	c := sample(t)
	c.Files[1].Data = []byte("# a \n")
	if b.Hash() == c.Hash() {
		t.Fatal("an edited file kept the hash")
	}
}

func TestDecodeRefusesWhatIsNotCanonical(t *testing.T) {
	enc, err := sample(t).Encode()
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"spaced":         bytes.Replace(enc, []byte(`"format":1`), []byte(`"format": 1`), 1),
		"unknown field":  bytes.Replace(enc, []byte(`{"format":1`), []byte(`{"extra":1,"format":1`), 1),
		"trailing data":  append(append([]byte(nil), enc...), []byte(" {}")...),
		"reordered keys": bytes.Replace(enc, []byte(`"format":1,"min_agent":"v0.1.0"`), []byte(`"min_agent":"v0.1.0","format":1`), 1),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := bundle.Decode(data); err == nil {
				t.Fatal("decoded")
			}
		})
	}
}

func TestShapeErrorsNameTheProblem(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []bundle.File
		min   string
		want  string
	}{
		{"no registry", []bundle.File{{Path: "scenes/a.toml"}}, "", "no devices.toml"},
		{"no scene", []bundle.File{{Path: "devices.toml"}}, "", "no scene file"},
		{"stray file", []bundle.File{{Path: "devices.toml"}, {Path: "scenes/a.toml"}, {Path: "agent.toml"}}, "", `file "agent.toml"`},
		{"nested scene", []bundle.File{{Path: "devices.toml"}, {Path: "scenes/x/a.toml"}}, "", "directly in scenes/"},
		{"dot scene", []bundle.File{{Path: "devices.toml"}, {Path: "scenes/..toml"}}, "", "start with '.'"},
		{"twice", []bundle.File{{Path: "devices.toml"}, {Path: "devices.toml"}, {Path: "scenes/a.toml"}}, "", "twice"},
		{"bad min agent", []bundle.File{{Path: "devices.toml"}, {Path: "scenes/a.toml"}}, "1.2", "min_agent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := bundle.New(tc.min, tc.files)
			if !errors.Is(err, bundle.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one saying %q", err, tc.want)
			}
		})
	}
}

func TestCompatibleComparesVersionsAndLetsDevBuildsRunAll(t *testing.T) {
	for _, tc := range []struct {
		min, agent string
		want       bool
	}{
		{"", "v0.1.0", true},
		{"v1.2.0", "v1.2.0", true},
		{"v1.2.0", "v1.10.0", true},
		{"v1.2.0", "v1.1.9", false},
		{"v2.0.0", "v1.9.9-rc1", false},
		{"v1.2.0", "dev", true},
	} {
		if got := bundle.Compatible(tc.min, tc.agent); got != tc.want {
			t.Errorf("Compatible(%q, %q) = %v, want %v", tc.min, tc.agent, got, tc.want)
		}
	}
}

func TestSettingsEncodeParsesBackToTheSameValues(t *testing.T) {
	lat, lon := 52.0, -0.5
	s := bundle.Settings{Location: bundle.Location{Latitude: &lat, Longitude: &lon, TimeZone: "Europe/Berlin"}}
	got, err := bundle.ParseSettings(s.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if *got.Location.Latitude != lat || *got.Location.Longitude != lon || got.Location.TimeZone != "Europe/Berlin" {
		t.Fatalf("got %+v", got.Location)
	}
	if (bundle.Settings{}).Encode() != nil {
		t.Fatal("empty settings rendered a file")
	}
}

func TestSettingsRefuseUnknownKeysAndBadValues(t *testing.T) {
	for in, want := range map[string]string{
		"[broker]\nlisten = \"x\"\n":        "unknown key",
		"[location]\nlatitude = 100.0\n":    "location.latitude",
		"[location]\ntimezone = \"Mars\"\n": "location.timezone",
	} {
		if _, err := bundle.ParseSettings([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err = %v, want one naming %s", in, err, want)
		}
	}
}

func TestFromDirReadsTheShippedConfig(t *testing.T) {
	b, err := bundle.FromDir("../configs", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Scenes()) == 0 {
		t.Fatal("no scenes read")
	}
	dir := t.TempDir()
	if err := b.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	again, err := bundle.FromDir(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if again.Hash() != b.Hash() {
		t.Fatal("written and read back, the hash changed")
	}
}
