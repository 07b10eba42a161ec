package check_test

import (
	"strings"
	"testing"

	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/bundle/check"
)

func TestTheShippedConfigValidates(t *testing.T) {
	b, err := bundle.FromDir("../../configs", "")
	if err != nil {
		t.Fatal(err)
	}
	set, err := check.Bundle(b)
	if err != nil {
		t.Fatal(err)
	}
	if set.Hash != b.Hash() || len(set.Catalog.Names()) == 0 {
		t.Fatalf("set %+v", set)
	}
}

func TestABadSceneIsRefusedNamingItsFile(t *testing.T) {
	b, err := bundle.FromDir("../../configs", "")
	if err != nil {
		t.Fatal(err)
	}
	files := append([]bundle.File(nil), b.Files...)
	files = append(files, bundle.File{Path: "scenes/zz_typo.toml", Data: []byte("[[scene]]\nname = \"x\"\n[[scene.step]]\ndevice = \"no_such_device\"\naction = \"on\"\n")})
	bad, err := bundle.New("", files)
	if err != nil {
		t.Fatal(err)
	}
	_, err = check.Bundle(bad)
	if err == nil || !strings.Contains(err.Error(), "scenes/zz_typo.toml") || !strings.Contains(err.Error(), "no_such_device") {
		t.Fatalf("err = %v", err)
	}
}

func TestASunScheduleNeedsAPositionInTheSettings(t *testing.T) {
	reg, err := bundle.FromDir("../../configs", "")
	if err != nil {
		t.Fatal(err)
	}
	sun := []byte("[[scene]]\nname = \"dusk\"\n[[scene.schedule]]\nname = \"s\"\nsun = \"sunset\"\n[[scene.step]]\ndelay = \"1s\"\n")
	regData, _ := reg.File(bundle.RegistryFile)
	b, err := bundle.New("", []bundle.File{{Path: bundle.RegistryFile, Data: regData}, {Path: "scenes/dusk.toml", Data: sun}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := check.Bundle(b); err == nil || !strings.Contains(err.Error(), "latitude") {
		t.Fatalf("without a position: err = %v", err)
	}
	placed, err := bundle.New("", append(b.Files, bundle.File{Path: bundle.SettingsFile, Data: []byte("[location]\nlatitude = 48.1\nlongitude = 11.6\n")}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := check.Bundle(placed); err != nil {
		t.Fatalf("with a position: %v", err)
	}
}
