// Package passwd hashes and checks the passwords of the MQTT clients of
// Sortie's embedded brokers (the hub's gateways; the agent's devices and
// apps), so that config files hold hashes, not passwords.
package passwd

import (
	"bufio"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/term"
)

// ErrInvalid marks an empty password or a malformed hash.
var ErrInvalid = errors.New("invalid password")

// scheme names the hash format:
// "pbkdf2-sha256$<iterations>$<salt, base64>$<key, base64>".
const scheme = "pbkdf2-sha256"

// Iterations is the PBKDF2 cost of Hash.
const Iterations = 210_000

// Hash returns a salted PBKDF2-SHA256 hash of password.
func Hash(password string) (string, error) { return HashCost(password, Iterations) }

// HashCost is Hash with another iteration count; tests use a low one.
func HashCost(password string, iterations int) (string, error) {
	if password == "" {
		return "", fmt.Errorf("%w: empty password", ErrInvalid)
	}
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return "", fmt.Errorf("hash password: %w", err)
	}
	key, err := pbkdf2.Key(sha256.New, password, salt, iterations, 32)
	if err != nil {
		return "", fmt.Errorf("hash password: %w", err)
	}
	enc := base64.RawStdEncoding
	return fmt.Sprintf("%s$%d$%s$%s", scheme, iterations, enc.EncodeToString(salt), enc.EncodeToString(key)), nil
}

// Credential is a parsed password hash.
type Credential struct {
	iter      int
	salt, key []byte
}

// Parse checks a hash made by Hash.
func Parse(h string) (Credential, error) {
	parts := strings.Split(h, "$")
	if len(parts) != 4 || parts[0] != scheme {
		return Credential{}, fmt.Errorf("%w: a password hash looks like %s$<iterations>$<salt>$<key>", ErrInvalid, scheme)
	}
	iter, err := strconv.Atoi(parts[1])
	if err != nil || iter < 1 {
		return Credential{}, fmt.Errorf("%w: password hash iterations %q", ErrInvalid, parts[1])
	}
	enc := base64.RawStdEncoding
	salt, err1 := enc.DecodeString(parts[2])
	key, err2 := enc.DecodeString(parts[3])
	if err1 != nil || err2 != nil || len(salt) == 0 || len(key) == 0 {
		return Credential{}, fmt.Errorf("%w: password hash is not valid base64", ErrInvalid)
	}
	return Credential{iter: iter, salt: salt, key: key}, nil
}

// Verify reports whether password is the one hashed, in constant time.
func (c Credential) Verify(password []byte) bool {
	if len(c.key) == 0 {
		return false
	}
	key, err := pbkdf2.Key(sha256.New, string(password), c.salt, c.iter, len(c.key))
	return err == nil && subtle.ConstantTimeCompare(key, c.key) == 1
}

// Book checks logins against credentials. It remembers a SHA-256 of the
// last password verified for each user, so that a reconnect storm pays
// PBKDF2 once per user rather than once per connection. Safe for
// concurrent use once filled.
//
// PBKDF2 is slow on purpose, which makes it a lever for whoever can reach
// the port: at most Parallel verifications run at once (the rest wait),
// so a flood of bad logins costs at most that many cores; and a login as
// an unknown user costs one verification too, so that the time taken
// does not tell which user names exist.
type Book struct {
	creds    map[string]Credential
	dummy    Credential // the cost of a real one, matching nothing
	slots    chan struct{}
	mu       sync.Mutex
	verified map[string][32]byte
}

// Parallel bounds the PBKDF2 verifications a Book runs at once.
const Parallel = 2

// NewBook returns an empty book.
func NewBook() *Book {
	return &Book{creds: map[string]Credential{}, verified: map[string][32]byte{}, slots: make(chan struct{}, Parallel)}
}

// Add sets user's credential; call it before the book is in use.
func (b *Book) Add(user string, c Credential) {
	b.creds[user] = c
	if b.dummy.key == nil {
		key := make([]byte, len(c.key))
		_, _ = rand.Read(key)
		b.dummy = Credential{iter: c.iter, salt: c.salt, key: key}
	}
}

// Has reports whether user has a credential.
func (b *Book) Has(user string) bool {
	_, ok := b.creds[user]
	return ok
}

// Check reports whether password is user's.
func (b *Book) Check(user string, password []byte) bool {
	if len(password) == 0 {
		return false
	}
	c, known := b.creds[user]
	sum := sha256.Sum256(password)
	if known {
		b.mu.Lock()
		prev, hit := b.verified[user]
		b.mu.Unlock()
		if hit && subtle.ConstantTimeCompare(prev[:], sum[:]) == 1 {
			return true
		}
	} else {
		c = b.dummy
	}
	b.slots <- struct{}{}
	ok := c.Verify(password)
	<-b.slots
	if !ok || !known {
		return false
	}
	b.mu.Lock()
	b.verified[user] = sum
	b.mu.Unlock()
	return true
}

// MinLength is the shortest password Read accepts.
const MinLength = 8

// Read takes a password for who: typed twice, unseen, when in is a
// terminal; else the first line of in; or, with generate, a random one
// (which the caller must show once: only its hash is kept).
func Read(in io.Reader, prompt io.Writer, who string, generate bool) (string, error) {
	if generate {
		b := make([]byte, 18)
		if _, err := rand.Read(b); err != nil {
			return "", fmt.Errorf("generate password: %w", err)
		}
		return base64.RawURLEncoding.EncodeToString(b), nil
	}
	var password string
	if f, ok := in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		// A prompt that cannot be shown does not stop the typing, so
		// its write errors are dropped.
		_, _ = fmt.Fprintf(prompt, "password for %s: ", who)
		first, err := term.ReadPassword(int(f.Fd()))
		_, _ = fmt.Fprintln(prompt)
		if err != nil {
			return "", fmt.Errorf("read password: %w", err)
		}
		_, _ = fmt.Fprintf(prompt, "again: ")
		again, err := term.ReadPassword(int(f.Fd()))
		_, _ = fmt.Fprintln(prompt)
		if err != nil {
			return "", fmt.Errorf("read password: %w", err)
		}
		if string(first) != string(again) {
			return "", errors.New("the two passwords differ")
		}
		password = string(first)
	} else {
		// A pipe or a file: the first line, for scripts.
		line, err := bufio.NewReader(in).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return "", fmt.Errorf("read password: %w", err)
		}
		password = strings.TrimRight(line, "\r\n")
	}
	if len(password) < MinLength {
		return "", fmt.Errorf("password must be at least %d characters", MinLength)
	}
	return password, nil
}
