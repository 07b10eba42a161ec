package bundle

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Format is the version of the encoding this package writes and reads.
const Format = 1

// Limits on what Decode accepts.
const (
	// MaxEncoded bounds a bundle's encoding: it travels in one uplink
	// message (uplink.MaxMessage is 1 MiB) with room for its envelope.
	MaxEncoded = 900 << 10
	// MaxFiles bounds the files of a bundle.
	MaxFiles = 512
	// maxName bounds a scene file's name.
	maxName = 128
)

// The files of a bundle, by path.
const (
	// RegistryFile is the device registry (devices.toml's format).
	RegistryFile = "devices.toml"
	// SettingsFile holds the settings that change without a restart
	// (Settings); it is optional.
	SettingsFile = "settings.toml"
	// SceneDir holds the scene files, "scenes/NAME.toml", at least one.
	SceneDir = "scenes/"
)

// Errors wrapped by Decode and Check.
var (
	// ErrInvalid is wrapped by every error about a bundle's shape.
	ErrInvalid = errors.New("invalid bundle")
	// ErrNotCanonical says the bytes decode but are not the bundle's
	// canonical encoding, so their hash would not be its hash.
	ErrNotCanonical = errors.New("bundle not in canonical form")
)

// File is one file of a bundle.
type File struct {
	Path string `json:"path"`
	Data []byte `json:"data"`
}

// Bundle is a gateway's configuration. Treat it as immutable once built:
// its hash is computed from its content each time it is asked for.
type Bundle struct {
	// Format is the encoding's version (Format).
	Format int `json:"format"`
	// MinAgent is the oldest agent version that may run the bundle
	// ("v1.4.0"); "" for any.
	MinAgent string `json:"min_agent,omitempty"`
	// Files are sorted by path, each path once.
	Files []File `json:"files"`
}

// New builds a bundle from files in any order, checking their shape.
func New(minAgent string, files []File) (*Bundle, error) {
	fs := slices.Clone(files)
	// sort.Slice, not slices.SortFunc: a generic sort made for File is
	// 9 KB of the agent's arm64 code, which is at its budget.
	sort.Slice(fs, func(i, j int) bool { return fs[i].Path < fs[j].Path })
	b := &Bundle{Format: Format, MinAgent: minAgent, Files: fs}
	if err := b.Check(); err != nil {
		return nil, err
	}
	return b, nil
}

// Check reports the first thing wrong with the bundle's shape (format,
// paths, order, sizes); what its files say is for package bundle/check.
func (b *Bundle) Check() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
	}
	if b.Format != Format {
		return bad("format %d, this agent reads format %d", b.Format, Format)
	}
	if b.MinAgent != "" {
		if _, ok := parseVersion(b.MinAgent); !ok {
			return bad("min_agent %q is not a version like v1.4.0", b.MinAgent)
		}
	}
	if len(b.Files) > MaxFiles {
		return bad("%d files, at most %d", len(b.Files), MaxFiles)
	}
	registry, scenes := false, 0
	for i, f := range b.Files {
		if i > 0 && b.Files[i-1].Path >= f.Path {
			return bad("files not sorted by path, or %q twice", f.Path)
		}
		switch {
		case f.Path == RegistryFile:
			registry = true
		case f.Path == SettingsFile:
		case strings.HasPrefix(f.Path, SceneDir):
			if err := checkSceneName(strings.TrimPrefix(f.Path, SceneDir)); err != nil {
				return bad("%q: %v", f.Path, err)
			}
			scenes++
		default:
			return bad("file %q: a bundle holds %s, %s and %sNAME.toml only", f.Path, RegistryFile, SettingsFile, SceneDir)
		}
	}
	if !registry {
		return bad("no %s", RegistryFile)
	}
	if scenes == 0 {
		return bad("no scene file (%sNAME.toml)", SceneDir)
	}
	return nil
}

func checkSceneName(name string) error {
	switch {
	case len(name) > maxName:
		return fmt.Errorf("name longer than %d bytes", maxName)
	case !strings.HasSuffix(name, ".toml") || len(name) == len(".toml"):
		return errors.New("a scene file is NAME.toml")
	case strings.HasPrefix(name, "."):
		return errors.New("a scene file's name does not start with '.'")
	case strings.ContainsAny(name, "/\\\x00") || path.Clean(name) != name:
		return errors.New("a scene file is directly in scenes/")
	}
	return nil
}

// Encode returns the bundle's canonical encoding.
func (b *Bundle) Encode() ([]byte, error) {
	if err := b.Check(); err != nil {
		return nil, err
	}
	out, err := json.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("encode bundle: %w", err)
	}
	if len(out) > MaxEncoded {
		return nil, fmt.Errorf("%w: %d bytes encoded, at most %d", ErrInvalid, len(out), MaxEncoded)
	}
	return out, nil
}

// Decode reads a bundle from its canonical encoding. Anything else (an
// unknown field, files out of order, other spacing) is an error.
func Decode(data []byte) (*Bundle, error) {
	if len(data) > MaxEncoded {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrInvalid, len(data), MaxEncoded)
	}
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	var b Bundle
	if err := d.Decode(&b); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if d.More() {
		return nil, fmt.Errorf("%w: data after the bundle", ErrInvalid)
	}
	again, err := b.Encode()
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(again, data) {
		return nil, ErrNotCanonical
	}
	return &b, nil
}

// Hash is the hex SHA-256 of the bundle's canonical encoding; "" for a
// bundle whose shape is wrong.
func (b *Bundle) Hash() string {
	enc, err := b.Encode()
	if err != nil {
		return ""
	}
	return HashOf(enc)
}

// HashOf is the hash of an encoding Decode accepts.
func HashOf(encoded []byte) string {
	sum := sha256.Sum256(encoded)
	return hex.EncodeToString(sum[:])
}

// File returns the content of the file at path.
func (b *Bundle) File(path string) ([]byte, bool) {
	i, ok := slices.BinarySearchFunc(b.Files, path, func(f File, p string) int { return strings.Compare(f.Path, p) })
	if !ok {
		return nil, false
	}
	return b.Files[i].Data, true
}

// Scenes returns the scene files, by path.
func (b *Bundle) Scenes() []File {
	var out []File
	for _, f := range b.Files {
		if strings.HasPrefix(f.Path, SceneDir) {
			out = append(out, f)
		}
	}
	return out
}

// Short is the first 12 hex digits of a hash, for people.
func Short(hash string) string {
	if len(hash) > 12 {
		return hash[:12]
	}
	return hash
}

// FromDir reads a bundle from a directory laid out like one:
// devices.toml, scenes/*.toml and, optionally, settings.toml. Other files
// in it are not read (a config directory such as configs/ also holds
// agent.toml). The directory's scenes/ subdirectories are not read,
// as "agent run" does not read them.
func FromDir(dir, minAgent string) (*Bundle, error) {
	files, err := readFiles(filepath.Join(dir, RegistryFile), filepath.Join(dir, "scenes"))
	if err != nil {
		return nil, err
	}
	if data, err := os.ReadFile(filepath.Join(dir, SettingsFile)); err == nil {
		files = append(files, File{Path: SettingsFile, Data: data})
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read bundle: %w", err)
	}
	return New(minAgent, files)
}

// FromFiles builds the bundle an agent started from its config files
// runs: the registry file, the scene directory's *.toml files, and the
// settings its config gives (rendered by Settings.Encode; none when it
// sets nothing). Its hash is what the agent reports when it runs from
// files, so a hand edit of any of them shows.
func FromFiles(registryPath, sceneDir string, s Settings) (*Bundle, error) {
	files, err := readFiles(registryPath, sceneDir)
	if err != nil {
		return nil, err
	}
	if enc := s.Encode(); enc != nil {
		files = append(files, File{Path: SettingsFile, Data: enc})
	}
	return New("", files)
}

func readFiles(registryPath, sceneDir string) ([]File, error) {
	reg, err := os.ReadFile(registryPath)
	if err != nil {
		return nil, fmt.Errorf("read bundle: %w", err)
	}
	files := []File{{Path: RegistryFile, Data: reg}}
	entries, err := os.ReadDir(sceneDir)
	if err != nil {
		return nil, fmt.Errorf("read bundle: %w", err)
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".toml") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(sceneDir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read bundle: %w", err)
		}
		files = append(files, File{Path: SceneDir + e.Name(), Data: data})
	}
	return files, nil
}

// WriteDir writes the bundle's files under dir, laid out as FromDir
// reads them.
func (b *Bundle) WriteDir(dir string) error {
	if err := os.MkdirAll(filepath.Join(dir, "scenes"), 0o755); err != nil {
		return err
	}
	for _, f := range b.Files {
		if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(f.Path)), f.Data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Compatible reports whether an agent of version agent may run a bundle
// that needs minAgent. A development build ("dev", or a version that is
// not vMAJOR.MINOR.PATCH) runs every bundle.
func Compatible(minAgent, agent string) bool {
	if minAgent == "" {
		return true
	}
	have, ok := parseVersion(agent)
	if !ok {
		return true
	}
	need, _ := parseVersion(minAgent)
	return slices.Compare(have[:], need[:]) >= 0
}

// parseVersion reads "vMAJOR.MINOR.PATCH", with any "-pre" or "+build"
// suffix ignored.
func parseVersion(s string) ([3]int, bool) {
	var v [3]int
	if !strings.HasPrefix(s, "v") {
		return v, false
	}
	s = s[1:]
	if i := strings.IndexAny(s, "-+"); i >= 0 {
		s = s[:i]
	}
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return v, false
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || (len(p) > 1 && p[0] == '0') {
			return v, false
		}
		v[i] = n
	}
	return v, true
}
